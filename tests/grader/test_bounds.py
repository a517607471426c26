"""The bound per submission (autograder.bounds) and the sandbox policy that carries it, on
fake control-group trees: no root needed. The real thing is graded in test_hostile.py (the
catalogue's tree-in-one-bound case, where this machine lets the grader make groups)."""

from __future__ import annotations

import os
import subprocess
import sys

from autograder import bounds, sandbox


def _v1(root):
    for controller in ("memory", "pids"):
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
    return root


def test_v2_with_memory_and_pids_is_used(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert bounds.detect(tmp_path) == bounds.Hierarchy(2, (tmp_path / bounds.GROUP,))


def test_v2_without_the_controllers_falls_back_and_says_why(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    found = bounds.detect(tmp_path)
    assert isinstance(found, str) and "memory and pids" in found
    assert bounds.describe(found, 2**33, 512).startswith("per process only (rlimits): cgroup v2")


def test_v1_memory_and_pids_hierarchies_are_used(tmp_path):
    found = bounds.detect(_v1(tmp_path))
    assert found == bounds.Hierarchy(
        1, (tmp_path / "memory" / bounds.GROUP, tmp_path / "pids" / bounds.GROUP)
    )
    assert bounds.describe(found, 8 * 2**30, 512) == "per submission, cgroup v1: 8 GiB, 512 tasks"


def test_no_cgroups_at_all_is_named(tmp_path):
    assert bounds.detect(tmp_path) == f"no cgroup memory and pids controllers under {tmp_path}"


def test_a_v1_group_gets_its_memory_and_task_limits(tmp_path):
    found = bounds.detect(_v1(tmp_path))
    procs = bounds.create(found, "k200000", 3 * 2**30, 64)
    memory, pids = (p.parent for p in procs)
    assert memory == tmp_path / "memory" / bounds.GROUP / "k200000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(3 * 2**30)
    assert (pids / "pids.max").read_text() == "64"
    assert [p.name for p in procs] == ["cgroup.procs", "cgroup.procs"]


def test_a_v2_group_gets_the_controllers_handed_down_and_its_limits(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    (procs,) = bounds.create(bounds.detect(tmp_path), "k200001", 2**30, 100)
    group = procs.parent
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (tmp_path / bounds.GROUP / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (group / "memory.max").read_text() == str(2**30)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "100"


def test_remove_takes_empty_groups_away(tmp_path):
    group = tmp_path / "k1"
    group.mkdir()
    bounds.remove([str(group / "cgroup.procs")])
    assert not group.exists()


def test_uids_are_the_lowest_free_and_never_shared(tmp_path):
    first, second = bounds.claim_uid(tmp_path), bounds.claim_uid(tmp_path)
    assert (first, second) == (bounds.FIRST_UID, bounds.FIRST_UID + 1)
    bounds.release_uid(tmp_path, first)
    assert bounds.claim_uid(tmp_path) == first  # given back: the lowest again


def test_a_uid_held_by_a_process_that_is_gone_is_taken_back(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / str(bounds.FIRST_UID)).write_text(gone)
    (tmp_path / str(bounds.FIRST_UID + 1)).write_text(str(os.getpid()))  # alive: kept
    assert bounds.claim_uid(tmp_path) == bounds.FIRST_UID
    assert bounds.claim_uid(tmp_path) == bounds.FIRST_UID + 2


def test_the_policy_carries_the_groups_and_limits_through_json():
    policy = sandbox.Policy(
        hidden_roots=["/course"], visible=["/venv"], workdir="/course/autograded/s/x", uid=7,
        cgroup_procs=["/sys/fs/cgroup/pids/autograder-kernels/k7/cgroup.procs"],
    )  # fmt: skip
    again = sandbox.Policy.from_json(policy.to_json())
    assert again == policy
    assert again.limits.memory_bytes == 8 * 2**30 and again.limits.tasks == 512
