"""The sandbox's policy (autograder/sandbox.py), travelling as configuration: what it hides and
shows, how the kernel manager (kernels.py) takes it, and the command that starts a kernel
inside the namespaces; where this machine allows the sandbox, ranks run in it write nothing to
stderr. test_hostile.py grades whole submissions in the real sandbox."""

from __future__ import annotations

import sys

import pytest
from traitlets.config import Config

from autograder import course, kernels, sandbox


def test_the_policy_hides_the_course_and_shows_the_environment(tmp_path):
    workdir = tmp_path / "autograded" / "alice" / "02"
    policy = sandbox.policy_for(workdir, course.ROOT)
    assert str(course.ROOT.resolve()) in policy.hidden_roots
    assert str(course.ROOT.resolve() / "shared") in policy.visible  # distopt, read-only
    assert str(sandbox.Path(sys.prefix).resolve()) in policy.visible
    assert policy.workdir == str(workdir)
    assert sandbox.Policy.from_json(policy.to_json()) == policy


def test_the_policy_hides_more_folders_when_told(tmp_path):
    socket_folder = tmp_path / "pg-socket"
    socket_folder.mkdir()
    gone = tmp_path / "no-such-folder"
    policy = sandbox.policy_for(tmp_path / "w", course.ROOT, also_hidden=[socket_folder, gone])
    assert str(socket_folder.resolve()) in policy.hidden_roots
    assert str(gone) not in policy.hidden_roots


def test_an_environment_reached_through_a_link_stays_visible(tmp_path, monkeypatch):
    """The kernel starts as <course>/.venv/bin/python when .venv links to a shared
    environment: that path must survive the tmpfs laid over the course root."""
    linked = tmp_path / "course" / ".venv"
    linked.parent.mkdir()
    linked.symlink_to(sandbox.Path(sys.prefix).resolve(), target_is_directory=True)
    monkeypatch.setattr(sys, "prefix", str(linked))
    monkeypatch.setattr(sys, "executable", str(linked / "bin" / "python"))
    policy = sandbox.policy_for(tmp_path / "work", tmp_path / "course")
    assert str(linked) in policy.visible  # the path the kernel is started by
    assert str(linked.resolve()) in policy.visible  # and the environment itself


def test_the_kernel_manager_takes_its_policy_from_the_configuration(tmp_path):
    policy = sandbox.policy_for(tmp_path / "work", course.ROOT)
    config = Config()
    config.SandboxedKernelManager.policy = policy.to_json()
    config.SandboxedKernelManager.runtime_dir = str(tmp_path / "run")
    km = kernels.SandboxedKernelManager(config=config)
    assert km.transport == "ipc"  # a kernel in its own network namespace: unix sockets
    assert km.connection_file.startswith(str(tmp_path / "run"))
    plain = kernels.SandboxedKernelManager(config=Config())
    assert plain.transport == "tcp"
    config.SandboxedKernelManager.policy = '{"workdir": 1}'
    with pytest.raises(ValueError, match="is not a Policy"):
        kernels.SandboxedKernelManager(config=config)


def test_the_wrapped_kernel_starts_in_the_namespaces_with_the_policy():
    policy = sandbox.Policy(hidden_roots=["/c"], visible=["/env"], workdir="/c/w", uid=200_001)
    command = sandbox.wrap(["python", "-m", "ipykernel_launcher"], policy)
    assert command[1:3] == ["--pdeathsig", "KILL"] and command[3].endswith("unshare")
    assert "--net" in command and "--pid" in command
    separator = command.index("--")
    assert sandbox.Policy.from_json(command[separator - 1]) == policy
    assert command[separator + 1 :] == ["python", "-m", "ipykernel_launcher"]


RANKS_IN_THE_SANDBOX = """\
import torch
import torch.distributed as dist
from distopt import launch

def total(rank, world_size):
    t = torch.ones(3)
    dist.all_reduce(t)
    return float(t.sum())

print(launch(total, 2, timeout=60))
"""


@pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox here: {sandbox.probe()}")
def test_ranks_in_the_sandbox_write_nothing_to_stderr(tmp_path):
    # nbgrader scores a test cell that wrote to stderr as failed: c10d's warning that it could
    # not name a client socket (no DNS in the namespace) once cost a student a test's points.
    import subprocess

    workdir = tmp_path / "student"
    workdir.mkdir()
    (workdir / "ranks.py").write_text(RANKS_IN_THE_SANDBOX)
    policy = sandbox.policy_for(workdir, course.ROOT)
    command = sandbox.wrap([sys.executable, str(workdir / "ranks.py")], policy)
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[6.0, 6.0]"
    assert done.stderr == "", done.stderr
