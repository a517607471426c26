"""distopt: the helper package of the course "Distributed optimization of large models".

One module per concept, grouped here by the section that introduced it:

* 01 data parallelism: ``comm`` (what collectives cost), ``collectives`` (ring and
  parameter-server all-reduce simulated on numpy arrays, with byte counts), ``overlap``
  (backward/all-reduce timelines with gradient buckets), ``critical_batch`` (critical batch
  size, gradient noise scale), ``data`` (toy logistic regression), ``ddp`` (measured DDP);
* 02 memory and sharding: ``memory`` (what training holds per device), ``sharding``
  (measured ZeRO-1 and FSDP2);
* 03 model parallelism: ``tensor_parallel``, ``pipeline``, ``experts``,
  ``sequence_parallel``, ``transformer`` (parameter and FLOP counts), ``planner`` (3D
  layouts), ``model_parallel`` (measured DTensor and pipelining runs);
* 04 large batches: ``classify`` (synthetic task and MLP), ``schedules``, ``optimizers``
  (LARS, LAMB), ``stability`` (spike monitor, checkpoint and rollback);
* 05 asynchronous and decentralized: ``least_squares``, ``stragglers``, ``async_sgd``,
  ``gossip``, ``local_sgd`` (local SGD, DiLoCo);
* 06 federated: ``federated``;
* 07 training project: ``recipe`` (AdamW groups, schedules), ``gpt`` (a small GPT, muP),
  ``corpus`` (a language with a known entropy rate), ``train`` (training loop and the
  ``torchrun`` entry point), ``hpsearch`` (successive halving, width sweeps), ``diagnose``
  (naming a problem from its curves);
* everywhere: ``launcher`` (``launch``: real multi-process runs with torch.distributed on
  CPU), ``grading`` (for notebook test cells) and ``units``.
"""

from distopt.launcher import LaunchError, LaunchTimeout, launch

__all__ = ["LaunchError", "LaunchTimeout", "launch"]
