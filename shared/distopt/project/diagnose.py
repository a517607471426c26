"""Name what went wrong in a training run from its logged curves, and the remedy.

A *history* is the plain dict that :mod:`distopt.project.loop` records (one entry per logged step):

* ``"step"`` (int), ``"loss"`` (training loss, may end in ``nan``/``inf``),
  ``"grad_norm"`` (global norm before clipping), ``"lr"``, ``"step_time"`` (wall seconds):
  lists of the same length;
* ``"val_step"`` (int) and ``"val_loss"``: validation loss at some steps, same length;
* optionally ``"compute_time"`` and ``"comm_time"`` (seconds per step spent computing and
  communicating, distributed runs only), as long as ``"step"``.

:func:`diagnose` applies the rules below in this order and returns the first that matches
(the most urgent problem first). Every statistic is a median over a window, so single noisy
steps do not decide anything.

1. ``"divergence"``: a non-finite loss, gradient norm or validation loss, or a run whose
   loss at the end (median of the last tenth) is above ``DIVERGENCE_RATIO`` times its loss at
   the start (median of the first tenth).
2. ``"slow_throughput"``: the run logs how long it computed, and computation took less than
   ``MIN_COMPUTE_FRACTION`` of the wall time (the rest is exposed communication or waiting).
   ``compute_time`` is used when logged, else ``step_time - comm_time``. Without either, step
   times alone cannot tell slow communication from a slow model, and this rule is skipped.
3. ``"loss_spikes"``: some loss is above ``SPIKE_RATIO`` times the median of the
   ``SPIKE_WINDOW`` steps before it (and the run recovered: rule 1 did not fire).
4. ``"overfitting"``: validation loss at the end (median of its last tenth, at least one
   point) is above ``1 + OVERFIT_RISE`` times its minimum, while the training loss kept
   falling after that minimum.
5. ``"plateau"``: the training loss fell by less than ``PLATEAU_MAX_DROP`` (relative) from
   the first tenth of the run to the last.
6. otherwise ``"healthy"``.

The thresholds are deliberately coarse: they separate clear cases, which is what a first
look at a dashboard does; a borderline run deserves a person's eyes.

:func:`synthetic_history` draws seeded, noisy histories of each kind, for tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from distopt.optim.recipe import cosine_schedule
from distopt.project.history import HISTORY_KEYS, PER_STEP_KEYS, TIMING_KEYS

__all__ = [
    "DIVERGENCE_RATIO",
    "MIN_COMPUTE_FRACTION",
    "MIN_STEPS",
    "OVERFIT_RISE",
    "PLATEAU_MAX_DROP",
    "PROBLEMS",
    "REMEDIES",
    "REQUIRED_KEYS",
    "SPIKE_RATIO",
    "SPIKE_WINDOW",
    "check_history",
    "diagnose",
    "synthetic_history",
]

PROBLEMS = ("healthy", "loss_spikes", "divergence", "plateau", "overfitting", "slow_throughput")
REQUIRED_KEYS = HISTORY_KEYS  # what a history must hold to be diagnosed

MIN_STEPS = 10  # fewer logged steps than this are too few to judge the curves
DIVERGENCE_RATIO = 1.2  # loss at the end this many times the loss at the start: diverged
MIN_COMPUTE_FRACTION = 0.6  # computing less than this share of the wall time: too slow
SPIKE_RATIO = 1.3  # a loss this many times the recent median is a spike (noise is ~1-5 %)
SPIKE_WINDOW = 10  # steps in the recent median a loss is compared with
OVERFIT_RISE = 0.03  # validation loss 3 % above its minimum at the end: overfitting
PLATEAU_MAX_DROP = 0.25  # training loss fell by less than a quarter over the run: plateau

REMEDIES: dict[str, str] = {
    "healthy": "Nothing to fix: keep training, keep watching the curves, keep checkpointing.",
    "loss_spikes": (
        "The step size is too large for the current sharpness, or a bad batch arrived. Lower "
        "the peak learning rate or lengthen the warm-up, clip the global gradient norm (1.0), "
        "and skip the offending steps or roll back to a checkpoint before the spike and go on "
        "with fresh data."
    ),
    "divergence": (
        "Something overflowed or exploded. In float16 use loss scaling (or switch to "
        "bfloat16), clip the gradient norm, check where the layer norms sit (pre-norm is "
        "more stable), lower the learning rate, and restart from the last good checkpoint."
    ),
    "plateau": (
        "The loss barely moves: the learning rate is probably far too low, the "
        "initialisation poor, or there is a bug. Run a learning-rate range test, check the "
        "gradients on a tiny model (can it overfit one batch?), and check the initial scale."
    ),
    "overfitting": (
        "The model memorises the training set: training loss falls while validation loss "
        "rises. Get more (or fresher) data, regularise (weight decay, dropout), or stop at "
        "the validation minimum."
    ),
    "slow_throughput": (
        "The accelerators wait instead of computing. Time computation and communication "
        "separately, then overlap them (gradient buckets, prefetching), shard less or "
        "communicate less often, raise the per-device batch, or fix the slow link or worker."
    ),
}


def check_history(history: Mapping[str, Sequence]) -> None:
    """Raise ``ValueError`` unless ``history`` has the keys and list lengths described above."""
    if not isinstance(history, Mapping):
        raise ValueError(f"history must be a dict of lists, got {type(history).__name__}")
    for key in REQUIRED_KEYS:
        if key not in history:
            raise ValueError(f"history has no {key!r} (needs {', '.join(REQUIRED_KEYS)})")
    lengths = {key: len(history[key]) for key in (*PER_STEP_KEYS, *TIMING_KEYS) if key in history}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"per-step lists must have the same length, got {lengths}")
    if lengths["step"] == 0:
        raise ValueError("history has no logged steps")
    if len(history["val_step"]) != len(history["val_loss"]):
        raise ValueError(
            f"'val_step' and 'val_loss' differ in length: "
            f"{len(history['val_step'])} != {len(history['val_loss'])}"
        )


def _floats(values: Sequence) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"history values must be numbers: {error}") from None


def _tenth(n: int) -> int:
    """Window for 'the start' and 'the end' of a curve: a tenth of it, at least one point."""
    return max(1, n // 10)


def _diverged(loss: np.ndarray, grad_norm: np.ndarray, val_loss: np.ndarray) -> bool:
    if not (np.isfinite(loss).all() and np.isfinite(grad_norm).all()):
        return True
    if not np.isfinite(val_loss).all():
        return True
    w = _tenth(len(loss))
    return bool(np.median(loss[-w:]) > DIVERGENCE_RATIO * np.median(loss[:w]))


def _compute_fraction(history: Mapping[str, Sequence]) -> float | None:
    """Share of the wall time spent computing, or None if the run did not log it."""
    wall = np.nansum(_floats(history["step_time"]))
    if "compute_time" in history:
        compute = np.nansum(_floats(history["compute_time"]))
    elif "comm_time" in history:
        compute = wall - np.nansum(_floats(history["comm_time"]))
    else:
        return None
    return float(compute / wall) if wall > 0 else None


def _has_spike(loss: np.ndarray) -> bool:
    for t in range(SPIKE_WINDOW, len(loss)):
        if loss[t] > SPIKE_RATIO * np.median(loss[t - SPIKE_WINDOW : t]):
            return True
    return False


def _overfitting(
    step: np.ndarray, loss: np.ndarray, val_step: np.ndarray, val_loss: np.ndarray
) -> bool:
    if len(val_loss) < 3:
        return False
    best = int(np.argmin(val_loss))
    end = np.median(val_loss[-_tenth(len(val_loss)) :])
    if end <= (1 + OVERFIT_RISE) * val_loss[best]:
        return False
    # Training loss around the validation minimum against training loss at the end.
    w = _tenth(len(loss))
    at_best = int(np.searchsorted(step, val_step[best]))
    around_best = loss[max(0, at_best - w // 2) : at_best + w // 2 + 1]
    return bool(np.median(loss[-w:]) < np.median(around_best))


def diagnose(history: Mapping[str, Sequence]) -> str:
    """The problem a history shows, one of :data:`PROBLEMS` (rules in the module docstring).

    Raises ``ValueError`` for a malformed history (the message names the missing key or the
    lists that differ in length), and for a finite run with fewer than ``MIN_STEPS`` logged
    steps whose timings show no problem either.
    """
    check_history(history)
    step = _floats(history["step"])
    loss = _floats(history["loss"])
    grad_norm = _floats(history["grad_norm"])
    val_step, val_loss = _floats(history["val_step"]), _floats(history["val_loss"])

    if _diverged(loss, grad_norm, val_loss):
        return "divergence"
    fraction = _compute_fraction(history)
    if fraction is not None and fraction < MIN_COMPUTE_FRACTION:
        return "slow_throughput"
    if len(loss) < MIN_STEPS:
        raise ValueError(f"{len(loss)} logged steps are too few to diagnose (need {MIN_STEPS})")
    if _has_spike(loss):
        return "loss_spikes"
    if _overfitting(step, loss, val_step, val_loss):
        return "overfitting"
    w = _tenth(len(loss))
    start, end = np.median(loss[:w]), np.median(loss[-w:])
    if start - end < PLATEAU_MAX_DROP * start:
        return "plateau"
    return "healthy"


def synthetic_history(problem: str, *, steps: int = 400, seed: int = 0) -> dict[str, list]:
    """A seeded, noisy history of ``steps`` logged steps that shows ``problem`` clearly.

    The healthy curve is a language-model-like loss ``floor + (start - floor) exp(-t/tau)``
    with 1-3 % multiplicative noise, a gradient norm that settles from ~3 to ~0.3, the
    recipe's warm-up + cosine learning rate, and a validation loss every ``steps // 20``
    steps. Each problem changes it the way a real run goes wrong: 2-4 spikes that decay
    within a few steps (``loss_spikes``); a gradient norm that grows exponentially until the
    loss is ``nan`` or ``inf``, where the lists end (``divergence``); a learning rate 100 times
    too small or a loss stuck after a small early drop (``plateau``); a training loss that
    keeps falling while validation loss turns up (``overfitting``); communication that takes
    1-3 times as long as computation and is not overlapped (``slow_throughput``). Other
    problems log ``compute_time``/``comm_time`` (well overlapped) for some seeds only.
    """
    if problem not in PROBLEMS:
        raise ValueError(f"problem must be one of {PROBLEMS}, got {problem!r}")
    if steps < 50:
        raise ValueError(f"steps must be >= 50 for recognisable curves, got {steps}")
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=float)
    start = rng.uniform(4.5, 6.0)  # about ln(vocabulary), the loss of uniform guessing
    floor = rng.uniform(1.2, 2.5)
    tau = steps * rng.uniform(0.05, 0.12)
    noise = rng.uniform(0.01, 0.03)
    peak_lr = rng.uniform(3e-4, 3e-3)
    warmup = max(1, steps // 20)

    smooth = floor + (start - floor) * np.exp(-t / tau)
    val_smooth = smooth * rng.uniform(1.0, 1.03)
    if problem == "plateau":
        if rng.random() < 0.5:  # learning rate far too low: a slow, almost straight descent
            peak_lr /= 100
            smooth = start * (1 - rng.uniform(0.0, 0.08) * t / steps)
        else:  # a small early drop (token frequencies learnt), then stuck there
            stuck = start * (1 - rng.uniform(0.02, 0.15))
            smooth = stuck + (start - stuck) * np.exp(-t / (rng.uniform(0.02, 0.1) * steps))
        val_smooth = smooth * rng.uniform(1.0, 1.01)
    elif problem == "overfitting":
        turn = steps * rng.uniform(0.3, 0.5)
        rise = rng.uniform(0.25, 0.5) * floor
        val_smooth = smooth + rise * np.clip((t - turn) / (steps - turn), 0, None)
        smooth = smooth - floor * rng.uniform(0.3, 0.6) * t / steps

    loss = smooth * (1 + noise * rng.standard_normal(steps))
    grad_norm = (0.3 + 3.0 * np.exp(-t / tau)) * rng.lognormal(0.0, 0.15, steps)
    lr = np.array(
        [cosine_schedule(s, peak_lr=peak_lr, warmup_steps=warmup, total_steps=steps) for s in t]
    )
    val_every = max(1, steps // 20)
    val_idx = np.arange(0, steps, val_every)
    # Validation runs on fixed batches: much less noisy than a training step's loss.
    val_loss = val_smooth[val_idx] * (1 + 0.15 * noise * rng.standard_normal(len(val_idx)))

    if problem == "loss_spikes":
        count = int(rng.integers(2, 5))
        # Away from both ends: a spike needs calm steps before it, and time to recover.
        first, last = max(2 * SPIKE_WINDOW, steps // 10), steps - max(15, steps // 5)
        starts = rng.choice(np.arange(first, last), count, replace=False)
        for t0 in starts:
            height = rng.uniform(0.6, 1.5)
            since = np.clip(t - t0, 0, None)
            decay = np.where(t >= t0, np.exp(-since / rng.uniform(2.0, 8.0)), 0.0)
            loss *= 1 + height * decay
            grad_norm *= 1 + 20 * height * decay
            val_loss *= 1 + 0.5 * height * decay[val_idx]
    end = steps
    if problem == "divergence":
        end = int(steps * rng.uniform(0.3, 0.8))  # the first non-finite step
        ramp = int(rng.integers(5, 30))
        growth = np.exp(np.clip(t - (end - ramp), 0, ramp) * rng.uniform(0.2, 0.5))
        grad_norm *= growth
        # The loss climbs by 30-100 % while the gradient norm explodes, then overflows.
        loss *= 1 + rng.uniform(0.3, 1.0) * np.clip((growth - 1) / (growth[end - 1] - 1), 0, 1)
        bad = rng.choice([math.nan, math.inf])
        loss[end], grad_norm[end] = bad, bad
        end += 1
        val_loss = val_loss[val_idx < end]
        val_idx = val_idx[val_idx < end]

    step_time = rng.uniform(0.02, 0.2) * rng.lognormal(0.0, 0.05, steps)
    history = {
        "step": [int(s) for s in t[:end]],
        "loss": loss[:end].tolist(),
        "grad_norm": grad_norm[:end].tolist(),
        "lr": lr[:end].tolist(),
        "step_time": step_time[:end].tolist(),
        "val_step": [int(s) for s in val_idx],
        "val_loss": val_loss.tolist(),
    }
    if problem == "slow_throughput" or rng.random() < 0.5:
        compute = step_time * rng.uniform(0.9, 1.0)
        if problem == "slow_throughput":
            comm = compute * rng.uniform(1.0, 3.0) * rng.lognormal(0.0, 0.1, steps)
            exposed = comm  # nothing overlaps
        else:
            comm = compute * rng.uniform(0.1, 0.5) * rng.lognormal(0.0, 0.1, steps)
            exposed = comm * rng.uniform(0.0, 0.3)  # mostly hidden behind the backward pass
        history["step_time"] = (compute + exposed)[:end].tolist()
        history["compute_time"] = compute[:end].tolist()
        history["comm_time"] = comm[:end].tolist()
    return history
