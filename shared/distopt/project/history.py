"""The course's training log: one dict of equal-length lists, per step and per evaluation.

Every training run of the course writes it (the in-notebook runs, the data-parallel worker,
the ``torchrun`` entry point) and ``diagnose`` reads it: ``step``, ``loss`` (nats/token),
``grad_norm`` (before clipping), ``lr``, ``step_time`` (s) per step; ``val_step`` and
``val_loss`` per evaluation. A distributed run that times its communication adds
``compute_time`` and ``comm_time`` (s) per step.
"""

from __future__ import annotations

__all__ = ["HISTORY_KEYS", "PER_STEP_KEYS", "TIMING_KEYS", "empty_history", "log"]

PER_STEP_KEYS = ("step", "loss", "grad_norm", "lr", "step_time")
HISTORY_KEYS = (*PER_STEP_KEYS, "val_step", "val_loss")
TIMING_KEYS = ("compute_time", "comm_time")  # only where communication is timed apart


def empty_history(*, timed: bool = False) -> dict[str, list]:
    """A history with every key and no entries (``timed``: with the timing keys too)."""
    keys = HISTORY_KEYS + (TIMING_KEYS if timed else ())
    return {key: [] for key in keys}


def log(history: dict[str, list], **values: float) -> None:
    """Append one value to each named list."""
    for key, value in values.items():
        history[key].append(value)
