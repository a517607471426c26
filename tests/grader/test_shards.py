"""Sharded grading without a class run: the split, the gradebook URL, the results table."""

from __future__ import annotations

import itertools
import json

import pytest

from autograder import course, shards, store
from autograder.results import Result
from autograder.shards import Shard

COSTS = {"01_a": 40.0, "02_b": 10.0, "07_c": 200.0}


def _class(students: int) -> list[tuple[str, str]]:
    return [(f"s{i:03d}", section) for i in range(students) for section in sorted(COSTS)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_the_shares_hold_every_submission_exactly_once(count):
    jobs = _class(23)
    parts = shards.split(jobs, COSTS, count)
    assert len(parts) == count
    flat = list(itertools.chain.from_iterable(parts))
    assert sorted(flat) == sorted(jobs) and len(flat) == len(set(flat))
    for part in parts:  # each share keeps the class's order
        assert part == sorted(part, key=jobs.index)


def test_the_shares_balance_cost_not_count():
    jobs = _class(10)  # 10 x (40 + 10 + 200) = 2500 s
    for count in (2, 3, 4):
        loads = [shards.cost(part, COSTS) for part in shards.split(jobs, COSTS, count)]
        # LPT: within the largest single submission of the ideal share
        assert max(loads) - sum(loads) / count <= max(COSTS.values()), loads
    halves = shards.split(jobs, COSTS, 2)
    assert [shards.cost(part, COSTS) for part in halves] == [1250.0, 1250.0]
    # Halving the submissions by count, section by section, would not balance them
    by_section = sorted(jobs, key=lambda job: (job[1], job[0]))
    by_count = [by_section[: len(jobs) // 2], by_section[len(jobs) // 2 :]]
    assert [shards.cost(part, COSTS) for part in by_count] == [450.0, 2050.0]
    assert shards.split(by_section, COSTS, 2) == [sorted(h, key=by_section.index) for h in halves]


def test_every_machine_computes_the_same_shares():
    jobs = _class(17)
    first = [shards.share(jobs, Shard(k, 4), COSTS) for k in range(1, 5)]
    again = [
        shards.share(list(reversed(jobs))[::-1], Shard(k, 4), dict(COSTS)) for k in (1, 2, 3, 4)
    ]
    assert first == again


def test_more_shards_than_submissions_leaves_some_empty():
    jobs = _class(1)
    parts = shards.split(jobs, COSTS, 5)
    assert sorted(len(p) for p in parts) == [0, 0, 1, 1, 1]


def test_shard_parsing_says_what_is_expected():
    assert Shard.parse("2/4") == Shard(2, 4) and Shard.parse(" 1 / 1 ").whole
    for bad, words in [("0/4", "1-based"), ("5/4", "between 1 and n"), ("2", "expected i/n")]:
        with pytest.raises(ValueError, match=words):
            Shard.parse(bad)
    assert Shard(1, 1).work == course.WORK
    assert Shard(2, 3).work == course.WORK / "shard-2-of-3"


def test_unmeasured_sections_cost_the_mean_of_the_others(tmp_path):
    path = tmp_path / "costs.json"
    assert shards.load_costs(path) == {}
    assert shards.costs_for(["x", "y"], {}) == {"x": 1.0, "y": 1.0}  # nothing known: by count
    path.write_text(json.dumps({"a": 10, "b": 30}))
    assert shards.costs_for(["a", "new"], shards.load_costs(path)) == {"a": 10.0, "new": 20.0}
    # what the course stores: a Run-All and a graded time; grading costs the graded one
    path.write_text(json.dumps({"a": {"run_all": 40, "graded": 10}}))
    assert shards.load_costs(path) == {"a": 10.0}


def test_every_section_of_the_course_has_a_measured_cost():
    known = shards.load_costs()
    missing = [s for s in course.sections() if s not in known]
    assert not missing, f"run `make section-costs SECTION='{' '.join(missing)}'` and commit"
    assert all(seconds > 0 for seconds in known.values())


def test_gradebook_urls():
    assert store.resolve(None) == course.GRADEBOOK_URL
    pg = store.resolve("postgres://alice:secret@db.example/course")
    assert pg.startswith("postgresql+psycopg://alice:secret@")
    assert "secret" not in store.redact(pg) and "***" in store.redact(pg)
    assert store.resolve("sqlite:////tmp/g.db") == "sqlite:////tmp/g.db?timeout=120"
    for bad, words in [
        ("not a url", "is not a database URL"),
        ("mysql://u@h/d", "SQLite .* or PostgreSQL"),
        ("postgresql+psycopg2://u@h/d", "is not installed with the course"),
    ]:
        with pytest.raises(store.GradebookError, match=words):
            store.resolve(bad)


def test_the_sandbox_hides_a_unix_socket_gradebook():
    assert store.socket_dir(course.GRADEBOOK_URL) is None
    assert store.socket_dir(store.resolve("postgresql://u@db.example/c")) is None  # TCP
    assert str(store.socket_dir(store.resolve("postgresql://u@/c?host=/tmp/pg"))) == "/tmp/pg"
    assert str(store.socket_dir(store.resolve("postgresql://u@/c"))) == store.DEFAULT_SOCKET_DIR


def test_an_unreachable_gradebook_is_named_not_raised(tmp_path):
    url = store.resolve(f"sqlite:///{tmp_path / 'no' / 'such' / 'folder' / 'g.db'}")
    assert "OperationalError" in store.check(url)
    assert store.check(store.resolve(f"sqlite:///{tmp_path / 'g.db'}")) is None


def test_the_results_table_keeps_one_row_per_submission(tmp_path):
    url = store.resolve(f"sqlite:///{tmp_path / 'g.db'}")
    table = store.Results(url)
    assert table.load() == {}  # no table yet
    with store.exclusive(url):
        store.create_tables(url)
        store.create_tables(url)  # idempotent
    first = Result("ann", "01_a", 1.0, 5.0, "graded", "feedback/ann.html", "failed test_x")
    table.save(first, sandbox="on", graded_by=store.graded_by("1/2"))
    again = Result("ann", "01_a", 5.0, 5.0, "graded", "feedback/ann.html", "every test passed")
    table.save(again, sandbox="on", graded_by=store.graded_by("2/2"))
    rows = table.load()
    table.close()
    assert list(rows) == [("ann", "01_a")]
    assert rows["ann", "01_a"]["score"] == 5.0 and rows["ann", "01_a"]["graded_by"].endswith("2/2")


def test_the_kubernetes_job_grades_one_shard_per_index():
    import re
    import subprocess

    import yaml

    cluster = course.AUTOGRADER / "cluster"
    job = yaml.safe_load((cluster / "grade-job.yaml").read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    command = " ".join(spec["template"]["spec"]["containers"][0]["command"])
    count = re.search(r'SHARD="\$\(\(JOB_COMPLETION_INDEX \+ 1\)\)/(\d+)"', command)
    assert count, command
    assert int(count[1]) == spec["completions"] == spec["parallelism"]
    script = cluster / "grade-array.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert 'SHARD="$index/$SLURM_ARRAY_TASK_COUNT"' in script.read_text()


def test_a_gradebook_made_before_the_resume_columns_gets_them(tmp_path):
    """A results table made before it kept the digest and the run (what a killed run resumes
    from) still loads, and gets the two columns when a class run registers."""
    import sqlite3

    path = tmp_path / "g.db"
    columns = [c for c in store.RESULTS.columns if c.name not in store.ADDED_COLUMNS]
    old = sqlite3.connect(path)
    old.execute(f"CREATE TABLE {store.RESULTS.name} ({', '.join(c.name for c in columns)})")
    old.execute(
        f"INSERT INTO {store.RESULTS.name} VALUES "
        "('ann', '01_a', 1.0, 5.0, 'graded', '', 'f.html', 'on', 'h shard 1/1', 0.0)"
    )
    old.commit()
    old.close()
    url = store.resolve(f"sqlite:///{path}")
    table = store.Results(url)
    assert table.load()["ann", "01_a"]["score"] == 1.0
    assert table.load(run_id="r") == {}  # no run to resume in it
    with store.exclusive(url):
        store.create_tables(url)
    assert table.load()["ann", "01_a"]["digest"] == ""
    table.save(Result("ann", "01_a", 5.0, 5.0, "graded", "f.html"), sandbox="on", graded_by="h",
               digest="d", run_id="r")  # fmt: skip
    assert table.results(run_id="r") == {
        ("ann", "01_a"): (Result("ann", "01_a", 5.0, 5.0, "graded", "f.html"), "d")
    }
    table.close()
