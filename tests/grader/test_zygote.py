"""The zygote that forks graded kernels warm (autograder/zygote.py) and the sandbox's side of it.

That kernels start warm and keep nothing of the zygote is checked on real submissions in
tests/grader/test_hostile.py (the ``warm-kernel`` case) and test_autograder.py (a kernel at
birth); here, the ways it must refuse, and what it is told to import and imports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder import course, sandbox, zygote
from autograder.catalogue import cases
from tests.helpers import ROOT


def _ask_as(uid: int, socket_path: str) -> str:
    """The zygote's first reply line to a request of ``uid`` (sandbox._run_kernel_in_zygote's
    protocol), asked from a forked child: this interpreter is not reachable by other users."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # only system calls and objects already loaded, then out
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(socket_path)
            data = json.dumps({"policy": "{}", "argv": ["true"], "env": {}}).encode()
            socket.send_fds(conn, [struct.pack("!I", len(data))], [0, 1, 2])
            conn.sendall(data)
            reply = repr(conn.makefile("r").readline())
        except BaseException as exc:
            reply = repr(exc)
        os.write(write, reply.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        reply = answer.read()
    os.waitpid(pid, 0)
    return reply


def test_pid1_starts_the_kernel_itself_when_no_zygote_answers(tmp_path):
    policy = sandbox.Policy(
        hidden_roots=[], visible=[], workdir=str(tmp_path), zygote=str(tmp_path / "none.sock")
    )
    assert sandbox._run_kernel_in_zygote(policy, ["true"]) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the zygote serves root only")
def test_the_zygote_serves_root_only_even_when_its_socket_is_reachable():
    runtime = Path(tempfile.mkdtemp(prefix="zygote-test-", dir="/tmp"))
    try:
        runtime.chmod(0o711)
        log = runtime / "log"
        with zygote.Zygote(str(log), runtime=runtime) as warm:
            assert warm.ready(), log.read_text()
            assert oct(Path(warm.folder).stat().st_mode & 0o777) == "0o700"
            # Open the way that the folder's mode closes: the zygote must still refuse.
            Path(warm.folder).chmod(0o711)
            Path(warm.socket).chmod(0o666)
            reply = _ask_as(65534, warm.socket)
            # Closed at once: an empty reply, or the request cut off (reset, broken pipe).
            assert reply == "''" or "Error(" in reply, reply
            # The waiter has written its refusal by the time the connection closed.
            assert "only root" in log.read_text()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_zygote_is_told_what_the_graded_sections_import(tmp_path, monkeypatch):
    """Set-up cells, answers and tests of the reference notebooks, magic lines skipped."""
    modules = set(zygote.modules_for(["02_memory_sharding"]))
    assert {"numpy", "torch", "matplotlib.pyplot", "distopt.costs.memory"} <= modules
    assert "distopt.units.GB" in modules  # a name, not a module: the zygote skips it
    assert not any(name.startswith("%") for name in modules)
    assert zygote.modules_for([]) == []
    for imports_torch in (False, True):
        root = tmp_path / str(imports_torch)
        cases.install(root, imports_torch=imports_torch)
        monkeypatch.setattr(course, "SOLUTIONS", root / "solutions")
        assert ("torch" in zygote.modules_for([cases.SECTION])) is imports_torch


def test_a_zygote_without_torch_imports_none_of_it():
    """The catalogue's zygote: what its notebook imports and ipykernel, neither torch nor
    matplotlib."""
    probe = (
        "import sys; from autograder import zygote; "
        "zygote._preload(['math', 'numpy', 'distopt.grading', 'distopt.grading.own_work']); "
        "print(sorted(m for m in ('torch', 'matplotlib', 'distopt.grading', 'ipykernel.kernelapp')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "['distopt.grading', 'ipykernel.kernelapp']"
