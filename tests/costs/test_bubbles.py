"""Tests of distopt.costs.bubbles: the two forms of the pipeline bubble agree."""

import math

from distopt.costs.bubbles import bubble_fraction, bubble_overhead


def test_overhead_and_fraction_agree():
    overhead = bubble_overhead(8, 32, interleave=2)
    assert math.isclose(overhead, 7 / 64)
    assert math.isclose(bubble_fraction(8, 32, interleave=2), overhead / (1 + overhead))
