"""The comparison of the kernel's fingerprints (autograder/integrity.py): each change named, a
rebound module name caught, a shadowed built-in only where the tests use it. Without a kernel;
test_fingerprint.py takes real fingerprints, test_hostile.py grades tampering end to end."""

from __future__ import annotations

from autograder import integrity


def _fingerprint(**changes):
    fp = {
        "modules": {"numpy": 1},
        "ids": {"numpy.allclose": 10, "math.isclose": 11},
        "foreign": [],
        "hooks": {"custom_exceptions": "()"},
        "names": {"open": "shadows built-in:open"},
    }
    for key, value in changes.items():
        fp[key] = {**fp[key], **value} if isinstance(fp[key], dict) else value
    return fp


def test_the_integrity_comparison_names_each_change():
    base, seen = _fingerprint(), {}
    assert integrity.differences(base, _fingerprint(), seen, set()) == []
    assert integrity.differences(base, _fingerprint(ids={"numpy.allclose": 99}), seen, set()) == [
        "numpy.allclose was replaced"
    ]
    hooked = _fingerprint(hooks={"custom_exceptions": "(<class 'BaseException'>,)"})
    assert integrity.differences(base, hooked, seen, set()) == [
        "the kernel's custom_exceptions was changed"
    ]
    assert integrity.differences(base, None, seen, set()) == [
        "the integrity check got no answer from the kernel"
    ]


def test_a_rebound_module_name_is_tampering_but_plain_data_is_not():
    base, seen = _fingerprint(), {}
    integrity.differences(base, _fingerprint(names={"math": "module:math"}), seen, set())
    assert seen == {"math": "math"}
    fake = _fingerprint(names={"math": "object:"})
    assert integrity.differences(base, fake, seen, set()) == [
        "the name 'math' no longer refers to the module math"
    ]
    assert integrity.differences(base, _fingerprint(names={"math": None}), seen, set()) == []


def test_shadowing_a_builtin_matters_only_where_tests_use_it():
    base, seen = _fingerprint(), {}
    mine = _fingerprint(names={"filter": "shadows built-in:filter"})
    assert integrity.differences(base, mine, seen, {"assert", "f"}) == []
    assert integrity.differences(base, mine, seen, {"filter"}) != []
    err = _fingerprint(names={"AssertionError": "shadows built-in:AssertionError"})
    assert integrity.differences(base, err, seen, set()) != []
