"""Splitting a class run over machines: ``make grade SHARD=i/n`` grades share i of n.

The class run is the list of (student, section) submissions. Each section has an expected
cost, the seconds one submission of it takes to grade (``section_costs.json``'s ``graded``,
measured by ``make section-costs``), and the shares are balanced by that cost, not by count: a
section-03 submission costs about twice one of section 04. The split is the longest-first greedy
(Graham's LPT rule, within 4/3 of the best possible makespan): submissions in decreasing cost
go one by one to the share with the least cost so far. It depends on nothing but the list of
submissions and the costs, so every machine that reads the same ``submitted/`` folder
computes the same shares, and together they hold every submission exactly once.
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass
from pathlib import Path

from autograder import course

Job = tuple[str, str]  # (student id, section)

COSTS = course.AUTOGRADER / "section_costs.json"


@dataclass(frozen=True)
class Shard:
    """Share ``index`` (1-based) of ``count``."""

    index: int = 1
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/n"`` with 1 <= i <= n; ValueError saying what is expected otherwise."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise ValueError(f"shard {text!r}: expected i/n, e.g. 1/4 (share 1 of 4)")
        index, count = int(match[1]), int(match[2])
        if not 1 <= index <= count:
            raise ValueError(f"shard {text!r}: i must be between 1 and n (shares are 1-based)")
        return cls(index, count)

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def work(self) -> Path:
        """This share's scratch folder: its run state, log and released notebooks. Shares that
        run at once on one shared course folder must not share them."""
        return course.WORK if self.whole else course.WORK / f"shard-{self.index}-of-{self.count}"


def load_costs(path: Path = COSTS) -> dict[str, float]:
    """Seconds to grade one submission, by section (empty if the file is missing): each
    section's ``graded`` time (a bare number is read as that too)."""
    if not path.is_file():
        return {}
    return {
        section: float(s["graded"] if isinstance(s, dict) else s)
        for section, s in json.loads(path.read_text()).items()
    }


def costs_for(sections: list[str], known: dict[str, float]) -> dict[str, float]:
    """Each section's expected cost; a section not measured yet costs the mean of the others
    (1 s each if none is known: then the shares balance by count)."""
    mean = sum(known.values()) / len(known) if known else 1.0
    return {section: known.get(section, mean) for section in sections}


def split(jobs: list[Job], costs: dict[str, float], count: int) -> list[list[Job]]:
    """``count`` shares of ``jobs`` balanced by cost (LPT), each in the order of ``jobs``."""
    order = sorted(jobs, key=lambda job: (-costs[job[1]], job))
    loads = [(0.0, k) for k in range(count)]  # (cost so far, share): least loaded first
    owner: dict[Job, int] = {}
    for job in order:
        load, k = heapq.heappop(loads)
        owner[job] = k
        heapq.heappush(loads, (load + costs[job[1]], k))
    return [[job for job in jobs if owner[job] == k] for k in range(count)]


def share(jobs: list[Job], shard: Shard, costs: dict[str, float]) -> list[Job]:
    """The submissions ``shard`` grades."""
    return split(jobs, costs, shard.count)[shard.index - 1]


def cost(jobs: list[Job], costs: dict[str, float]) -> float:
    return sum(costs[section] for _, section in jobs)
