"""How big a model a compute budget should buy: Hoffmann et al. 2022 ("Chinchilla").

Training costs C = 6 N D FLOPs for N parameters and D tokens (Kaplan et al. 2020). For a fixed
C, a bigger model sees fewer tokens. Hoffmann et al. trained over 400 models to find the split
with the lowest loss, and report it two ways:

* their approaches 1 and 2 (envelopes of many training curves, and IsoFLOP profiles) find N and
  D growing in equal proportion, about **20 tokens per parameter** (their Table 3: 1B parameters
  want 20.2B tokens): :func:`compute_optimal_split`;
* their approach 3 fits a loss law to all runs (their equation 2 with the fitted values of
  section D.2), ``L(N, D) = E + A / N**alpha + B / D**beta``: :func:`fitted_loss`, whose
  minimum along C = 6 N D has a closed form (their equation 4): :func:`fitted_optimum`.

The batch size has a scaling law too: Kaplan et al. 2020 (section 5.1) fit the critical batch
of their language models as a function of the loss reached, ``B_crit(L) = B_* / L**(1 /
alpha_B)`` tokens (:func:`kaplan_critical_batch`): the lower the loss, the noisier the
gradient relative to its mean, and the larger the batch worth using.

The two Chinchilla results do not agree exactly: the fitted law's optimum holds more tokens per
parameter than 20. Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt") traced
the gap to the fit, refitted approach 3 to the data read off the paper's figure and got a law
whose optimum agrees with approaches 1 and 2 (:data:`BESIROGLU_FIT`; every function that uses
a fit takes ``fit=``). Neither is a law of nature, only of one corpus, tokenizer and recipe.
:func:`compute_to_reach` inverts a fit: the least compute whose optimal split reaches a loss.
"""

from __future__ import annotations

import math

__all__ = [
    "BESIROGLU_FIT",
    "FIT",
    "TOKENS_PER_PARAM",
    "compute_optimal_split",
    "compute_to_reach",
    "fitted_loss",
    "fitted_optimum",
    "kaplan_critical_batch",
    "training_flops",
]

TOKENS_PER_PARAM = 20.0  # approaches 1 and 2 (Table 3)
# approach 3's fit, Hoffmann et al. 2022, section D.2: L(N, D) = E + A / N**alpha + B / D**beta
FIT = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
# Besiroglu et al. 2024, the same law refitted (their equation 2 with the estimates of section 3)
BESIROGLU_FIT = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}
# Kaplan et al. 2020, section 5.1: B_crit(L) = B_STAR / L**(1 / ALPHA_B), tokens, L in nats
KAPLAN_B_STAR_TOKENS = 2e8
KAPLAN_ALPHA_B = 0.21


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def training_flops(num_params: float, num_tokens: float) -> float:
    """C = 6 N D: forward (2 FLOPs per weight and token) and backward (twice that)."""
    _positive(num_params=num_params, num_tokens=num_tokens)
    return 6 * num_params * num_tokens


def compute_optimal_split(
    compute_flops: float, tokens_per_param: float = TOKENS_PER_PARAM
) -> tuple[float, float]:
    """(N, D) with 6 N D = ``compute_flops`` and D = ``tokens_per_param`` N."""
    _positive(compute_flops=compute_flops, tokens_per_param=tokens_per_param)
    num_params = math.sqrt(compute_flops / (6 * tokens_per_param))
    return num_params, tokens_per_param * num_params


def fitted_loss(num_params: float, num_tokens: float, *, fit: dict = FIT) -> float:
    """Approach 3's predicted loss (nats per token on their corpus) of N parameters on D tokens;
    ``fit``: Hoffmann et al.'s constants, or :data:`BESIROGLU_FIT`."""
    _positive(num_params=num_params, num_tokens=num_tokens)
    return fit["E"] + fit["A"] / num_params ** fit["alpha"] + fit["B"] / num_tokens ** fit["beta"]


def fitted_optimum(compute_flops: float, *, fit: dict = FIT) -> tuple[float, float]:
    """(N, D) minimising :func:`fitted_loss` (with ``fit``) subject to 6 N D = ``compute_flops``.

    Setting the derivative along the constraint to zero gives alpha A / N**alpha = beta B /
    D**beta, so N = G (C / 6)**(beta / (alpha + beta)) with G = (alpha A / (beta B))**(1 /
    (alpha + beta)), and D = (C / 6) / N.
    """
    _positive(compute_flops=compute_flops)
    a, b = fit["alpha"], fit["beta"]
    g = (a * fit["A"] / (b * fit["B"])) ** (1 / (a + b))
    num_params = g * (compute_flops / 6) ** (b / (a + b))
    return num_params, compute_flops / 6 / num_params


def compute_to_reach(loss: float, *, fit: dict = FIT) -> float:
    """The least compute C (FLOPs) whose optimal split (:func:`fitted_optimum`) has
    :func:`fitted_loss` ``loss``; the optimal loss falls monotonically in C, so bisection (on
    log C) finds it. ValueError if ``loss`` is not above the fit's irreducible ``E``."""
    if not loss > fit["E"]:
        raise ValueError(f"loss must be above the fit's E = {fit['E']}, got {loss!r}")

    def optimal_loss(log_c: float) -> float:
        return fitted_loss(*fitted_optimum(math.exp(log_c), fit=fit), fit=fit)

    lo, hi = math.log(1e6), math.log(1e40)
    if optimal_loss(hi) > loss:
        raise ValueError(f"loss {loss!r} needs more than 1e40 FLOPs under this fit")
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if optimal_loss(mid) > loss else (lo, mid)
    return math.exp(hi)


def kaplan_critical_batch(loss_nats: float) -> float:
    """Kaplan et al.'s fitted critical batch, in tokens, of a model at loss ``loss_nats``."""
    _positive(loss_nats=loss_nats)
    return KAPLAN_B_STAR_TOKENS / loss_nats ** (1 / KAPLAN_ALPHA_B)
