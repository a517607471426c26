"""The likely bug named for mistakes the classifier never learned from: section 04's held-out
variants (tests/grader/mutants/heldout.py) graded as students, tests only, in their rounds
(about 10 s; conftest.py marks it slow). ``python -m autograder.likely_bugs heldout``
measures every section."""

from autograder import likely_bugs
from tests.grader.mutants import heldout


def test_held_out_mistakes_fail_their_own_tests_and_are_named_right_or_not_at_all():
    counts = likely_bugs.heldout(["04_large_batch"], quiet=True)["04_large_batch"]
    held = heldout.held_out("large_batch")
    assert counts["escaped"] == 0 and counts["cascades"] == 0, counts
    assert counts["known_variants"] == sum(h.known for h in held), counts
    assert counts["new_variants"] == sum(not h.known and not h.partly for h in held), counts
    # partly right answers (right for the visible cases): never a wrong name, never a shortcut
    assert counts["partly_variants"] == sum(h.partly for h in held), counts
    assert counts["partly_wrong"] == 0 and counts["partly_visible"] == 0, counts
    # a wrong name is worse than none: never one, for a known mistake or a new one
    assert counts["wrong"] == 0 and counts["new_wrong"] == 0, counts
    known = counts["right"] + counts["ambiguous"] + counts["none"]
    assert known >= counts["known_variants"] and counts["right"] >= 0.8 * known, counts
    assert counts["new_none"] >= counts["new_variants"], counts
