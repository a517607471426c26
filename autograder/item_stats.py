"""Item statistics of a class: which tests separate strong from weak students, and which mislead.

For every graded test of a section, over the submissions that were graded (a missing
notebook is not an answer to any item):

* **difficulty**: the share of submissions that earn the test's full points (classical test
  theory's *p*; 1.0 = everyone passes);
* **discrimination**: the point-biserial correlation between the test's score (as a share of
  its points) and the *rest* of the section's score (the total less this test), so that an
  item is not correlated with itself. Positive: the students who pass it do better on the
  rest; negative: the stronger students fail it more often, the mark of a misleading
  exercise or a test that checks something else than the text asks;
* **flags**: "everyone passes", "nobody passes" (the item tells nothing about the class),
  "negative discrimination". A flag is for a person to look at, not a verdict: in a class
  of five, one student moves every figure;
* **named bugs**: :func:`named_bugs`, per test, the catalogued mistakes that the failures
  looked like (autograder/likely_bugs.py, as grades.csv's reasons name them) and how many
  students each: the common wrong answers of an exercise, for the next lecture.

:func:`score_figure` draws the score distribution of a section for the report's folder.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

FIGURES = "report_figures"  # beside report.md


@dataclass(frozen=True)
class ItemStats:
    test: str
    points: float
    graded: int  # submissions graded
    passed: int  # earning full points
    difficulty: float  # passed / graded
    discrimination: float | None  # None: undefined (no spread in the item or in the rest)

    def flags(self) -> list[str]:
        found = []
        if self.graded >= 2 and self.passed == self.graded:
            found.append("everyone passes")
        if self.graded >= 2 and self.passed == 0:
            found.append("nobody passes")
        if self.discrimination is not None and self.discrimination < 0:
            found.append("negative discrimination")
        return found


def point_biserial(item: Sequence[float], rest: Sequence[float]) -> float | None:
    """Pearson's correlation of an item's scores with the rest scores (the point-biserial
    coefficient when the item is 0/1); None when either has no spread."""
    n = len(item)
    if n != len(rest):
        raise ValueError(f"{n} item scores but {len(rest)} rest scores")
    if n < 2:
        return None
    mean_x, mean_y = sum(item) / n, sum(rest) / n
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(item, rest, strict=True))
    var_x = sum((x - mean_x) ** 2 for x in item)
    var_y = sum((y - mean_y) ** 2 for y in rest)
    if var_x == 0 or var_y == 0:
        return None
    return cov / math.sqrt(var_x * var_y)


def item_statistics(
    scores: dict[str, dict[str, float]], points: dict[str, float]
) -> list[ItemStats]:
    """Per test, from ``scores`` (student -> test -> points earned) and each test's maximum;
    the tests in the order of ``points``."""
    students = sorted(scores)
    totals = {s: sum(scores[s].values()) for s in students}
    found = []
    for test, maximum in points.items():
        earned = [scores[s].get(test, 0.0) for s in students]
        share = [e / maximum if maximum else 0.0 for e in earned]
        rest = [totals[s] - e for s, e in zip(students, earned, strict=True)]
        passed = sum(e >= maximum for e in earned)
        found.append(
            ItemStats(
                test,
                maximum,
                len(students),
                passed,
                passed / len(students) if students else 0.0,
                point_biserial(share, rest),
            )
        )
    return found


# grades.csv's words for a failed test with a named mistake (outcomes.FailedTest.phrase with
# likely_bugs.reason): "test_f (AssertionError; likely bug: <label>, exact match of 2 ...)"
_NAMED = re.compile(
    r"(\w+) \((?:[^;()]*; )?likely bug: (.+?), (?:exact|alike|near) match of \d+ "
    r"catalogued cases?\)"
)


# likely_bugs.reason for a catalogued shortcut named on evidence (autograder/evidence.py):
# "test_f (AssertionError; suspected shortcut: <label>, exact match of 1 catalogued case;
# evidence: <what the answer shows>)"
_SUSPECTED = re.compile(
    r"(\w+) \((?:[^;()]*; )?suspected shortcut: (.+?), (?:exact|alike|near) match of \d+ "
    r"catalogued cases?; evidence: ([^()]+)\)"
)


def suspected_shortcuts(reasons: Iterable[str]) -> list[tuple[str, str, str]]:
    """(test, shortcut, evidence) of every suspected shortcut in the reasons, for a person."""
    return [hit for reason in reasons for hit in _SUSPECTED.findall(reason or "")]


def named_bugs(reasons: Iterable[str]) -> dict[str, Counter]:
    """Per test, how many students' failures of it each catalogued mistake was named for,
    from the ``reason`` of each student's row (one row per student and section)."""
    found: dict[str, Counter] = {}
    for reason in reasons:
        for test, label in dict(_NAMED.findall(reason or "")).items():
            found.setdefault(test, Counter())[label] += 1
    return found


def score_figure(section: str, scores: list[float], max_score: float, folder: Path) -> Path:
    """A histogram of a section's scores (one bar per point), saved as PNG in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 2.6))
    edges = [x - 0.5 for x in range(int(math.ceil(max_score)) + 2)]
    ax.hist(scores, bins=edges, color="tab:blue", edgecolor="white")
    ax.set_xlim(-0.5, max_score + 0.5)
    ax.set_xlabel(f"score (of {max_score:g})")
    ax.set_ylabel("submissions")
    ax.set_title(f"{section}: {len(scores)} graded submissions", fontsize=10)
    ax.yaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    path = folder / f"{section}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
