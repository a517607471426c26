"""Claims about measured numbers, checked with a stated band instead of exact digits.

A number from float training or BLAS-dependent code changes in its last digits with the CPU's
kernels (another CPU family, another vector width): a student's laptop does not print what
the reference machine printed. The course prints such numbers in cells whose output nbval
ignores, and ends the cell with the claim the number supports, checked here::

    claims.between("final test loss with warm-up", warm_loss, 1.05, 1.25, unit="nats",
                   meaning="warm-up keeps the large-batch run out of its early blow-up")
    claims.holds("the float16 run overflows within 10 steps", steps <= 10,
                 observed=f"it logged {steps} steps")

Each band is wider than the spread measured across kernel selections (``make spread``) and
says what a miss means. A miss raises :class:`OutsideBand`; ``make check`` reports it in
words, not as a mismatch.
"""

from __future__ import annotations

import math

__all__ = ["OutsideBand", "between", "holds"]


class OutsideBand(AssertionError):
    """A measured number fell outside the band the course states for every CPU."""


def _number(value: float) -> str:
    return f"{value:.4g}"


def between(
    what: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    unit: str = "",
    meaning: str = "",
) -> None:
    """Return if low <= value <= high (either bound may be None); else raise OutsideBand.

    (Nothing is returned, so that a claim at the end of a cell displays nothing.)

    what    -- the quantity, as the text names it ("final test loss with warm-up")
    unit    -- printed after the numbers ("nats", "%")
    meaning -- what the band stands for, one sentence, shown when it is missed
    """
    if low is None and high is None:
        raise ValueError(f"a band for {what!r} needs a low or a high bound (or both)")
    if low is not None and high is not None and low > high:
        raise ValueError(f"band for {what!r} is empty: low {low} > high {high}")
    value = float(value)
    # nan is outside every band; inf compares like any other number
    inside = (
        not math.isnan(value) and (low is None or value >= low) and (high is None or value <= high)
    )
    if not inside:
        suffix = f" {unit}" if unit else ""
        if low is not None and high is not None:
            band = f"between {_number(low)} and {_number(high)}{suffix}"
        elif low is not None:
            band = f"at least {_number(low)}{suffix}"
        else:
            band = f"at most {_number(high)}{suffix}"
        raise OutsideBand(
            f"{what} is {_number(value)}{suffix}; the course expects {band} on every CPU. "
            + (f"{meaning}. " if meaning else "")
            + _advice()
        )


def holds(what: str, condition: bool, *, observed: str = "", meaning: str = "") -> None:
    """Return if condition is true; else OutsideBand naming the claim and what was seen."""
    if not condition:
        raise OutsideBand(
            f"expected: {what}"
            + (f"; observed: {observed}" if observed else "")
            + ". "
            + (f"{meaning}. " if meaning else "")
            + _advice()
        )


def _advice() -> str:
    return (
        "Check the functions this cell uses (their tests above); if they pass and nothing "
        "else was changed, the band is too narrow for this CPU: tell your instructor."
    )
