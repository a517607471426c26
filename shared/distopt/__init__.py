"""distopt: the helper package of the course "Distributed optimization of large models".

One module per concept: ``memory`` (what training holds per device), ``comm`` (what
collectives cost), ``collectives`` (ring and parameter-server all-reduce simulated on numpy
arrays, with byte counts), ``overlap`` (backward/all-reduce timelines with gradient buckets),
``critical_batch`` (the critical batch size and the gradient noise scale), ``data`` (toy
logistic-regression data), ``launcher`` (``launch``: real multi-process runs with
torch.distributed on CPU), ``ddp`` (measured DDP training and all-reduce times),
``sharding`` (measured ZeRO/FSDP runs), ``federated`` (FedAvg, FedProx, SCAFFOLD and
friends on a seeded client population), ``grading`` (for notebook test cells) and ``units``.
"""

from distopt.launcher import LaunchError, LaunchTimeout, launch

__all__ = ["LaunchError", "LaunchTimeout", "launch"]
