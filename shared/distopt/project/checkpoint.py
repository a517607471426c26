"""Checkpoints of a distributed run that resume exactly: model, optimizer, step, data position.

Written with ``torch.distributed.checkpoint`` (each rank writes its own shards, so DDP and
FSDP2 runs save alike), into a new folder per checkpoint, plus a small ``meta.json`` that
rank 0 writes last: it always names a complete checkpoint, so a run killed while saving
resumes from the previous one. Batches are drawn by step number, so the data position is the
step.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

__all__ = ["load", "save"]


def save(directory: Path, model: nn.Module, optimizer, step: int, history: dict) -> None:
    """Distributed checkpoint (each rank writes its shards) plus a small meta.json.

    ``step``: the next step to run, which is also the data position (batches are drawn by
    step number). meta.json is written last, by rank 0, so it names a complete checkpoint.
    """
    model_state, optim_state = get_state_dict(model, optimizer)
    name = f"step-{step:06d}"  # a new folder each time: never half-overwrite the last good one
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory / name)
    dist.barrier()
    if dist.get_rank() == 0:
        meta = {"step": step, "data_position": step, "state": name, "history": history}
        (directory / "meta.json.tmp").write_text(json.dumps(meta))
        (directory / "meta.json.tmp").replace(directory / "meta.json")
    dist.barrier()


def load(directory: Path, model: nn.Module, optimizer) -> tuple[int, dict]:
    """Load the checkpoint meta.json names into model and optimizer (in place); returns the
    step to continue from and the history so far."""
    meta = json.loads((directory / "meta.json").read_text())
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory / meta["state"])
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return meta["data_position"], meta["history"]
