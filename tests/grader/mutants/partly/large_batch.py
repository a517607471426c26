"""Partly right answers of section 04 (optimizers for very large batches): each passes every
visible check of its exercise and fails a hidden case only (see heldout.py's ``partly``)."""

from tests.grader.mutants import bug
from tests.grader.mutants.heldout import partly

PARTLY = [
    # --- Exercise 1: linear_scaled_lr ---------------------------------------------------------
    # The visible cases pass base_lr and base_batch by keyword; the hidden ones by position too.
    partly(
        bug(
            "linear_scaled_lr",
            "the parameters in another order: (batch_size, base_batch, base_lr)",
            "def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256):",
            "def linear_scaled_lr(batch_size, base_batch=256, base_lr=0.1):",
        )
    ),
    # The visible cases are all valid; the hidden ones ask for a ValueError at batch 0.
    partly(
        bug(
            "linear_scaled_lr",
            "no check of the batch sizes: batch 0 gives rate 0",
            '    if batch_size <= 0 or base_batch <= 0:\n        raise ValueError(f"batch sizes '
            'must be positive, got {batch_size} and {base_batch}")\n',
            "",
        )
    ),
    # --- Exercise 2: warmup_cosine_lr ---------------------------------------------------------
    # The visible schedule has a decay phase; with warmup_steps == total_steps the step
    # total_steps reaches the cosine with 0 / 0.
    partly(
        bug(
            "warmup_cosine_lr",
            "final_lr only after total_steps (step > total_steps)",
            "if step >= total_steps:",
            "if step > total_steps:",
        )
    ),
    # The visible steps are all valid; the hidden ones ask for a ValueError at step -1.
    partly(
        bug(
            "warmup_cosine_lr",
            "no check of the arguments: a negative step or too long a warm-up accepted",
            '    if step < 0:\n        raise ValueError(f"step must be >= 0, got {step}")\n'
            "    if total_steps < 1 or not 0 <= warmup_steps <= total_steps:\n"
            '        raise ValueError("need 0 <= warmup_steps <= total_steps and '
            'total_steps >= 1")\n',
            "",
        )
    ),
    # --- Exercise 3: lars_step ----------------------------------------------------------------
    # Every visible layer has nonzero weights; a zero-initialised layer gets ratio 0 and never
    # moves, where the rule says ratio 1.
    partly(
        bug(
            "lars_step",
            "only the denominator guarded: a zero layer's ratio is 0, not 1",
            "ratio = w_norm / denominator if w_norm > 0 and denominator > 0 else 1.0",
            "ratio = w_norm / denominator if denominator > 0 else 1.0",
        )
    ),
    # Both visible cases pass trust_coefficient=0.01; the hidden defaults case does not.
    partly(
        bug(
            "lars_step",
            "the example's trust coefficient 0.01 as the default, not 0.001",
            "weight_decay=0.0, trust_coefficient=0.001):",
            "weight_decay=0.0, trust_coefficient=0.01):",
        )
    ),
    # --- Exercise 4: lamb_step ----------------------------------------------------------------
    partly(
        bug(
            "lamb_step",
            "only ||u|| guarded: a zero layer's ratio is 0, not 1",
            "ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0",
            "ratio = w_norm / u_norm if u_norm > 0 else 1.0",
        )
    ),
    # As some LAMB implementations do: right while ||w|| / ||u|| stays below 10, as in the
    # visible cases, wrong for a large layer with small updates.
    partly(
        bug(
            "lamb_step",
            "the trust ratio clipped at 10",
            "ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0",
            "ratio = min(w_norm / u_norm, 10.0) if w_norm > 0 and u_norm > 0 else 1.0",
        )
    ),
    # --- Exercise 5: clip_by_global_norm ------------------------------------------------------
    # The visible arrays are fresh in each call; the hidden test checks they are not modified.
    partly(
        bug(
            "clip_by_global_norm",
            "the arrays scaled in place (g *= scale)",
            "    return [g * scale for g in grads], total\n",
            "    for g in grads:\n        g *= scale\n    return grads, total\n",
        )
    ),
    # The visible arrays are vectors; g @ g is no squared norm for a matrix.
    partly(
        bug(
            "clip_by_global_norm",
            "each squared norm as g @ g, right for vectors only",
            "total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))",
            "total = math.sqrt(sum(float(g @ g) for g in grads))",
        )
    ),
]
