"""distopt: the helper package of the course "Distributed optimization of large models".

One module per concept: ``memory`` (what training holds per device), ``comm`` (what
collectives cost), ``launcher`` (``launch``: real multi-process runs with torch.distributed
on CPU), ``sharding`` (measured ZeRO/FSDP runs), ``grading`` (for notebook test cells) and
``units``.
"""

from distopt.launcher import LaunchError, LaunchTimeout, launch

__all__ = ["LaunchError", "LaunchTimeout", "launch"]
