"""Item statistics against a hand computation on a class of four."""

import math

import pytest

from autograder.item_stats import item_statistics, point_biserial, score_figure

# Four students, three tests worth 2, 1 and 1 points.
SCORES = {
    "a": {"t1": 2, "t2": 1, "t3": 0},
    "b": {"t1": 2, "t2": 0, "t3": 0},
    "c": {"t1": 0, "t2": 1, "t3": 1},
    "d": {"t1": 0, "t2": 0, "t3": 1},
}
POINTS = {"t1": 2, "t2": 1, "t3": 1}


def test_point_biserial_matches_the_hand_computation():
    # item (1, 1, 0, 0) against rest (3, 2, 1, 0): cov 0.5, sd 0.5 and sqrt(1.25): 2 / sqrt(5)
    assert point_biserial([1, 1, 0, 0], [3, 2, 1, 0]) == pytest.approx(2 / math.sqrt(5))
    assert point_biserial([1, 1, 1], [0, 1, 2]) is None  # no spread in the item
    with pytest.raises(ValueError, match="3 item scores but 2"):
        point_biserial([1, 0, 1], [1, 2])


def test_difficulty_discrimination_and_flags_of_a_small_class():
    stats = {s.test: s for s in item_statistics(SCORES, POINTS)}
    t1, t2, t3 = stats["t1"], stats["t2"], stats["t3"]
    assert (t1.passed, t1.graded, t1.difficulty) == (2, 4, 0.5)
    # t1 share (1, 1, 0, 0) against rest (1, 0, 2, 1): means 0.5 and 1, covariance
    # (0 - 0.5 - 0.5 + 0) / 4 = -0.25, variances 0.25 and 0.5: r = -1/sqrt(2)
    assert t1.discrimination == pytest.approx(-0.25 / math.sqrt(0.25 * 0.5))
    assert "negative discrimination" in t1.flags()
    # t2 share (1, 0, 1, 0) against rest (2, 2, 1, 1): no correlation
    assert t2.discrimination == pytest.approx(0.0)
    assert t2.flags() == []
    assert (t3.passed, t3.difficulty) == (2, 0.5)


def test_flags_for_items_everyone_or_nobody_passes():
    scores = {s: {"easy": 1, "hard": 0, "x": i % 2} for i, s in enumerate("abc")}
    stats = {s.test: s for s in item_statistics(scores, {"easy": 1, "hard": 1, "x": 1})}
    assert stats["easy"].flags() == ["everyone passes"]
    assert stats["hard"].flags() == ["nobody passes"]
    assert stats["easy"].discrimination is None


def test_the_score_figure_is_written(tmp_path):
    path = score_figure("99_catalogue", [0, 3, 5, 5], 5, tmp_path)
    assert path.name == "99_catalogue.png" and path.stat().st_size > 1000


def test_named_bugs_are_counted_per_test_from_the_reasons():
    from autograder import likely_bugs, outcomes
    from autograder.item_stats import named_bugs

    def failed(test, label, level="exact", cases=1):  # as the grader words it (worker._ran)
        found = likely_bugs.Match(label, "bug", "", level, cases)
        return outcomes.FailedTest(
            grade_id=test, why="AssertionError", likely=likely_bugs.reason(found)
        ).phrase()

    halved = "the gradient halved (a factor 1/2, not 1/N)"
    reasons = [
        "failed "
        + ", ".join([failed("test_a", halved), failed("test_b", "sends left", "alike", 3)]),
        "failed " + ", ".join([failed("test_a", halved, "near", 2), "test_c (AssertionError)"]),
        "failed " + failed("test_a", "one of 2 mistakes that fail exactly alike: x; or y"),
        "failed test_b (NotYourOwnWork); cell 3 raised KeyError",
        "every test passed",
        "",
    ]
    # by hand: test_a named 'halved' for students 1 and 2, the tie for student 3; test_b once;
    # test_c and the fourth student's test_b failed without a name
    assert named_bugs(reasons) == {
        "test_a": {halved: 2, "one of 2 mistakes that fail exactly alike: x; or y": 1},
        "test_b": {"sends left": 1},
    }


def test_the_report_lists_the_named_bugs_per_exercise():
    from autograder import likely_bugs, outcomes, report

    found = likely_bugs.Match("ratio inverted: base_batch / batch_size", "bug", "", "exact", 1)
    phrase = outcomes.FailedTest(
        grade_id="test_linear_scaled_lr", why="AssertionError", likely=likely_bugs.reason(found)
    ).phrase()
    rows = [{"reason": f"failed {phrase}"}] * 2 + [{"reason": "every test passed"}]
    lines = report.bug_table(rows)
    assert lines[2:4] == ["| exercise | test | likely bug | students |", "|---|---|---|---|"]
    row = (
        "| linear_scaled_lr | test_linear_scaled_lr | ratio inverted: base_batch / batch_size | 2 |"
    )
    assert lines[4] == row
    assert report.bug_table(rows[2:]) == []
