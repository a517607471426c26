"""distopt.claims: bands that pass inside, fail outside with a message that explains."""

import math

import pytest

from distopt import claims


def test_a_value_inside_its_band_passes_and_displays_nothing():
    assert claims.between("loss", 1.1, 1.0, 1.2, unit="nats") is None
    claims.between("loss", 1.0, 1.0, 1.2)  # the bounds belong to the band
    claims.between("gain", 5.0, low=3.0)
    claims.between("gap", -1.0, high=0.0)


@pytest.mark.parametrize(
    ("value", "low", "high", "band"),
    [
        (1.3, 1.0, 1.2, "between 1 and 1.2 nats"),
        (0.5, 1.0, None, "at least 1 nats"),
        (2.0, None, 1.5, "at most 1.5 nats"),
        (math.nan, 0.0, 10.0, "between 0 and 10 nats"),
        (math.inf, 0.0, 10.0, "between 0 and 10 nats"),
    ],
)
def test_a_value_outside_its_band_says_value_band_and_meaning(value, low, high, band):
    with pytest.raises(claims.OutsideBand) as error:
        claims.between("final loss", value, low, high, unit="nats", meaning="warm-up helps")
    message = str(error.value)
    assert message.startswith(f"final loss is {value:.4g} nats;"), message
    assert band in message and "on every CPU" in message and "warm-up helps." in message
    assert isinstance(error.value, AssertionError), "a missed band is a failed assertion"


def test_an_infinite_value_passes_a_one_sided_band_it_satisfies():
    claims.between("loss", math.inf, low=10.0)


def test_bad_bands_are_refused():
    with pytest.raises(ValueError, match="needs a low or a high"):
        claims.between("x", 1.0)
    with pytest.raises(ValueError, match="empty"):
        claims.between("x", 1.0, 2.0, 1.0)


def test_holds_names_the_claim_and_what_was_observed():
    claims.holds("the run stays finite", True)
    with pytest.raises(claims.OutsideBand) as error:
        claims.holds("the run stays finite", False, observed="nan at step 6")
    assert "expected: the run stays finite; observed: nan at step 6." in str(error.value)
