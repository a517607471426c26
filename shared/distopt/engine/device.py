"""Which backend and device a launch's ranks use: gloo on CPUs, NCCL on GPUs.

The same rank code runs on a laptop and on a GPU node; what differs is decided here, once per
launch, in the launching process:

* **gloo** (CPU tensors): always possible, the default wherever there is no CUDA;
* **NCCL** (one GPU per rank, rank ``r`` on ``cuda:r``): chosen automatically where CUDA and
  NCCL are present and there is a GPU for every rank. NCCL refuses two ranks of one
  communicator on the same GPU ("duplicate GPU"), so a launch with more ranks than GPUs runs
  on gloo instead, and says so in :attr:`Placement.why`.

``backend=`` of :func:`distopt.launch` or the environment variable ``DISTOPT_BACKEND``
(``auto``, ``gloo`` or ``nccl``) chooses; an explicit ``nccl`` that cannot work is an error that
says why, before any process starts. Without either, a launch uses :data:`DEFAULT`, gloo, even
on a GPU machine: no GPU has yet run every exercise's reference answer on NCCL (``make
gpu-check`` does, with ``DISTOPT_BACKEND=auto``), and a student's notebook must not be the
first place a bench's CPU tensor meets NCCL. Once a GPU run passes, DEFAULT becomes ``auto``.

In a rank, :func:`current` is the rank's device. On a GPU the launcher makes it the rank's
default device (``torch.set_default_device``), so the tensors and modules the benches and a
student's code create without naming a device land on it; a tensor made from numpy
(``torch.from_numpy``) stays on the CPU and must be moved with :func:`put`. Values a rank
returns come back to the launching process on the CPU (:func:`to_cpu`), so that a notebook
without CUDA context can read them.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["BACKENDS", "ENV", "Placement", "choose", "current", "put", "to_cpu"]

ENV = "DISTOPT_BACKEND"  # auto, gloo or nccl
DEFAULT = "gloo"  # where neither the call nor the environment chooses (see above)
BACKENDS = ("auto", "gloo", "nccl")
# Set in each rank by distopt.engine.rank: the device it computes on ("cpu", "cuda:1" ...).
DEVICE_ENV = "DISTOPT_DEVICE"
# Where a launch appends "world_size backend" (gpu-check counts which launches ran on NCCL).
LOG_ENV = "DISTOPT_BACKEND_LOG"


@dataclass(frozen=True)
class Placement:
    """A launch's backend, the device type its ranks compute on, and why."""

    backend: str  # "gloo" or "nccl"
    device_type: str  # "cpu" or "cuda"
    gpus: int  # CUDA devices visible to the launching process
    why: str  # one sentence for a person

    def device(self, rank: int) -> str:
        """Rank ``rank``'s device: ``cpu``, or ``cuda:<rank>`` (one GPU per rank)."""
        return "cpu" if self.device_type == "cpu" else f"cuda:{rank % self.gpus}"


def _visible_gpus() -> tuple[int, bool]:
    """(number of CUDA devices, whether torch has NCCL), without creating a CUDA context."""
    import torch

    if not torch.cuda.is_available():
        return 0, False
    import torch.distributed as dist

    return torch.cuda.device_count(), bool(dist.is_nccl_available())


def choose(world_size: int, backend: str | None = None, *, visible=_visible_gpus) -> Placement:
    """The placement of a launch of ``world_size`` ranks.

    ``backend``: ``"gloo"``, ``"nccl"``, ``"auto"``, or None (then ``$DISTOPT_BACKEND``, else
    :data:`DEFAULT`). Auto picks NCCL where CUDA and NCCL are present and there are at least
    ``world_size`` GPUs, else gloo. ``visible`` returns (GPUs, NCCL present); tests replace it.

    Raises:
        ValueError: an unknown backend, or NCCL asked for where it cannot run: no CUDA, torch
            without NCCL, or fewer GPUs than ranks.
    """
    asked = backend if backend is not None else os.environ.get(ENV, "") or DEFAULT
    asked = asked.strip().lower()
    if asked not in BACKENDS:
        source = "backend=" if backend is not None else f"${ENV}="
        raise ValueError(
            f"launch: {source}{asked!r} is not a backend; use one of {', '.join(BACKENDS)} "
            "(auto: NCCL where there is a GPU for every rank, else gloo)"
        )
    if asked == "gloo":
        why = (
            "gloo was asked for"
            if backend is not None or os.environ.get(ENV)
            else f"gloo, the default (set {ENV}=auto for NCCL where there is a GPU per rank)"
        )
        return Placement("gloo", "cpu", 0, f"{why}: CPU tensors")
    gpus, nccl = visible()
    if gpus and nccl and gpus >= world_size:
        return Placement("nccl", "cuda", gpus, f"NCCL: one of the {gpus} GPUs per rank")
    if not gpus:
        reason = "no CUDA device is visible"
    elif not nccl:
        reason = "this torch has no NCCL"
    else:
        reason = (
            f"{world_size} ranks but {gpus} GPU{'s' * (gpus != 1)}: NCCL needs a GPU of its own "
            "for every rank (it refuses two ranks on one GPU)"
        )
    if asked == "nccl":
        raise ValueError(
            f"launch: backend 'nccl' cannot run here: {reason}. Launch fewer ranks, or use "
            "backend='gloo' (CPU tensors) or 'auto'"
        )
    return Placement("gloo", "cpu", gpus, f"gloo on CPUs: {reason}")


def current():
    """This rank's device (``torch.device``): where the launcher placed it, CPU outside a
    launch."""
    import torch

    return torch.device(os.environ.get(DEVICE_ENV, "cpu"))


def put(value: Any) -> Any:
    """``value`` (a tensor, or lists, tuples and dicts of them) on this rank's device."""
    return _map_tensors(value, lambda t: t.to(current()))


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (in lists, tuples, dicts) moved to the CPU."""
    return _map_tensors(value, lambda t: t.cpu() if t.device.type != "cpu" else t)


def _map_tensors(value: Any, fn) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):  # a copy keeps the dict's class (and a defaultdict's factory)
        out = copy.copy(value)
        for key, item in value.items():
            out[key] = _map_tensors(item, fn)
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value
