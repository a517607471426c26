"""Tests of distopt.launch: results, failures (raise, hang, silent death), cleanup, Jupyter."""

from __future__ import annotations

import _thread
import multiprocessing
import multiprocessing.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel

from distopt import LaunchError, LaunchTimeout, launch
from distopt.engine.examples import (
    allreduce_rank,
    exit_on_rank,
    flood_on_rank,
    hang_on_rank,
    raise_on_rank,
    rank_info,
)

# A timeout the failing launches below must not wait for: they fail fast, well before it.
LONG_TIMEOUT_S = 300


def _assert_all_gone(pids: list[int]) -> None:
    """Every pid is gone (reaped), and no multiprocessing child is left."""
    assert pids, "the error should carry the children's pids"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert multiprocessing.active_children() == []


def _temporary_files_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """New temporary files and folders go to ``folder``. multiprocessing's own folder, made
    once per process by whichever launch comes first, is made before: it is not the
    launcher's to remove, and the tests must not depend on their order."""
    multiprocessing.util.get_temp_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_allreduce_sums_ranks(world_size: int) -> None:
    expected = world_size * (world_size + 1) / 2
    assert launch(allreduce_rank, world_size) == [expected] * world_size
    assert multiprocessing.active_children() == []


def test_results_ordered_by_rank_and_output_captured(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    _temporary_files_in(tmp_path, monkeypatch)
    infos = launch(rank_info, 3)
    assert [info["rank"] for info in infos] == [0, 1, 2]
    assert {info["world_size"] for info in infos} == {3}
    assert len({info["pid"] for info in infos}) == 3
    # One thread per rank in the children, and the parent's environment is restored.
    assert {info["omp_num_threads"] for info in infos} == {"1"}
    assert {info["torch_num_threads"] for info in infos} == {1}
    assert os.environ["OMP_NUM_THREADS"] == "7"
    # The ranks printed to stdout, stderr and fd 1: none of it reaches the caller.
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    # The ranks' log files are gone with their temporary directory.
    assert list(tmp_path.iterdir()) == []


def test_two_launches_in_a_row() -> None:
    assert launch(allreduce_rank, 2) == [3.0, 3.0]
    assert launch(allreduce_rank, 2) == [3.0, 3.0]


def test_raising_rank_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # launch keeps the ranks' logs in a temporary directory: it must remove it, even here.
    _temporary_files_in(tmp_path, monkeypatch)
    start_s = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(raise_on_rank, 4, 2, timeout=LONG_TIMEOUT_S)
    elapsed_s = time.monotonic() - start_s
    assert elapsed_s < LONG_TIMEOUT_S / 2, f"took {elapsed_s:.0f} s: it waited for the timeout"
    message = str(info.value)
    assert not isinstance(info.value, LaunchTimeout)
    assert "rank 2 of 4 raised ValueError: boom on rank 2" in message
    assert "Traceback" in message and "raise_on_rank" in message
    # The tail of the failing rank's own output is quoted too.
    assert "rank 2: about to raise" in message
    _assert_all_gone(info.value.pids)
    assert len(info.value.pids) == 4
    assert list(tmp_path.iterdir()) == []


def test_hanging_rank_times_out() -> None:
    timeout_s = 5.0
    start_s = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(hang_on_rank, 2, 1, timeout=timeout_s)
    elapsed_s = time.monotonic() - start_s
    # not before the timeout, and not long after it (a generous bound: a busy machine)
    assert timeout_s <= elapsed_s < timeout_s + 60
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, LaunchError)
    message = str(info.value)
    # The hung rank and the rank waiting for it in the all-reduce.
    assert "ranks [0, 1] of 2 had not finished" in message
    assert "skips a collective" in message
    _assert_all_gone(info.value.pids)


def test_silently_dying_rank_reports_exit_code() -> None:
    start_s = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(exit_on_rank, 3, 1, timeout=LONG_TIMEOUT_S)
    assert time.monotonic() - start_s < LONG_TIMEOUT_S / 2, "it waited for the timeout"
    # Rank 1 is blamed, not the ranks whose all-reduce failed because it vanished.
    assert "rank 1 of 3 died without reporting a result (exit code 3)" in str(info.value)
    _assert_all_gone(info.value.pids)


def test_keyboard_interrupt_leaves_no_process() -> None:
    # Ctrl-C in a notebook raises KeyboardInterrupt in the main thread while launch waits.
    # Python's own SIGINT handler, as a kernel has: under `make test` an earlier test of the
    # same xdist worker can leave SIGINT ignored, and interrupt_main then does nothing.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(hang_on_rank, 2, 0, timeout=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert multiprocessing.active_children() == []


def _make_nested_function(offset: int) -> object:
    def local_worker(rank: int, world_size: int) -> int:
        return rank + offset

    return local_worker


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(lambda rank, world_size: rank * 10, [0, 10]), (_make_nested_function(5), [5, 6])],
    ids=["lambda", "nested function with a closure"],
)
def test_functions_travel_by_value(fn: object, expected: list[int]) -> None:
    assert launch(fn, 2) == expected


def test_an_argument_that_cannot_be_pickled_is_refused_before_spawning() -> None:
    with pytest.raises(ValueError, match="picklable"):
        launch(allreduce_rank, 2, threading.Lock())
    assert multiprocessing.active_children() == [], "nothing may have been spawned"


@pytest.mark.parametrize(
    ("world_size", "timeout"),
    [(0, 10.0), (-1, 10.0), (2.0, 10.0), (True, 10.0), ("2", 10.0), (2, 0.0), (2, -1.0)],
)
def test_invalid_arguments(world_size: object, timeout: float) -> None:
    with pytest.raises(ValueError, match="world_size|timeout"):
        launch(allreduce_rank, world_size, timeout=timeout)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real Jupyter kernel, as a notebook has; ``run(code)`` returns (reply, outputs)."""
    runtime = tmp_path_factory.mktemp("jupyter_runtime")
    # ipykernel does not capture fd-level output when it sees PYTEST_CURRENT_TEST; a
    # notebook's kernel does, which is what leaks the children's output into cells.
    kernel_env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    kernel_env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    kernel_manager, client = start_new_kernel(
        kernel_name="python3", startup_timeout=60, cwd=str(runtime), env=kernel_env
    )

    def run(code: str, timeout: float = 120) -> tuple[dict, list[tuple[str, dict]]]:
        outputs: list[tuple[str, dict]] = []

        def keep_output(message: dict) -> None:
            if message["msg_type"] in ("stream", "error", "execute_result", "display_data"):
                outputs.append((message["msg_type"], message["content"]))

        reply = client.execute_interactive(code, timeout=timeout, output_hook=keep_output)
        return reply, outputs

    try:
        yield run
    finally:
        client.stop_channels()
        kernel_manager.shutdown_kernel(now=True)


def test_launch_inside_jupyter_kernel(kernel) -> None:
    """In a real kernel, the ranks' output must not end up in the cell's output."""
    reply, outputs = kernel(
        "from distopt.engine.examples import allreduce_rank, rank_info\n"
        "from distopt import launch\n"
        "infos = launch(rank_info, 2)  # prints in the children\n"
        "print(launch(allreduce_rank, 2))\n"
    )
    assert reply["content"]["status"] == "ok", outputs
    assert outputs == [("stream", {"name": "stdout", "text": "[3.0, 3.0]\n"})]


def test_a_worker_defined_in_notebook_cells_runs(kernel) -> None:
    """Rank code written in cells, calling a helper from another cell, runs on the ranks."""
    kernel("import torch\nimport torch.distributed as dist\nfrom distopt import launch\n")
    kernel("def doubled(x):\n    return 2 * x\n")
    kernel(
        "def my_rank_code(rank, world_size, base):\n"
        "    t = torch.tensor([float(doubled(rank + base))])\n"
        "    dist.all_reduce(t)\n"
        "    return t.item()\n"
    )
    reply, outputs = kernel("print(launch(my_rank_code, 2, 1))")
    assert reply["content"]["status"] == "ok", outputs
    assert outputs == [("stream", {"name": "stdout", "text": "[6.0, 6.0]\n"})]


def test_an_error_in_cell_code_shows_the_cells_own_lines(kernel) -> None:
    kernel("from distopt import launch\n")
    kernel(
        "def broken_rank_code(rank, world_size):\n"
        "    print(f'rank {rank} starts')\n"
        "    weights = [1.0, 2.0]\n"
        "    return weights[rank + 1]  # rank 1 reads past the end\n"
    )
    reply, outputs = kernel("launch(broken_rank_code, 2)")
    assert reply["content"]["status"] == "error"
    message = "\n".join(str(content.get("evalue", "")) for kind, content in outputs)
    assert "rank 1 of 2 raised IndexError" in message, message
    assert "return weights[rank + 1]  # rank 1 reads past the end" in message, message
    assert "rank 1 starts" in message, "the tail of the rank's own output is quoted"


def test_a_rank_that_skips_a_collective_ends_at_the_timeout_naming_the_ranks(kernel) -> None:
    kernel("import torch\nimport torch.distributed as dist\nfrom distopt import launch\n")
    kernel(
        "def skips_one(rank, world_size):\n"
        "    if rank != 0:\n"
        "        dist.all_reduce(torch.ones(1))  # rank 0 never joins\n"
        "    return rank\n"
    )
    start_s = time.monotonic()
    reply, outputs = kernel("launch(skips_one, 2, timeout=5)")
    assert reply["content"]["status"] == "error"
    assert time.monotonic() - start_s < 5 + 60
    message = "\n".join(str(content.get("evalue", "")) for kind, content in outputs)
    assert "timed out after 5 s; ranks [1] of 2 had not finished" in message, message
    assert "skips a collective" in message


def _not_written_yet(rank: int, world_size: int) -> None:
    raise NotImplementedError()


def test_unwritten_rank_code_raises_not_implemented_error() -> None:
    """As an unanswered exercise does in a notebook's own cells."""
    with pytest.raises(NotImplementedError, match="rank [01] of 2 raised NotImplementedError"):
        launch(_not_written_yet, 2)
    assert multiprocessing.active_children() == []


def test_a_flooding_rank_is_quoted_in_a_few_kilobytes() -> None:
    with pytest.raises(LaunchError) as raised:
        launch(flood_on_rank, 2, 1, 20, timeout=LONG_TIMEOUT_S)
    message = str(raised.value)
    assert len(message) < 20_000
    assert "start of the message" in message and "its end" in message
    assert "first words" in message and "last words" in message
    assert "bytes cut" in message and "characters cut" in message


_KILLPG = """
from distopt import LaunchError, launch
from distopt.engine.examples import kill_group_on_rank

try:
    launch(kill_group_on_rank, 2, 1, timeout=60)
except LaunchError as exc:
    print("launch failed:", str(exc).splitlines()[0])
print(launch(kill_group_on_rank, 2, 5, timeout=60))  # the launcher still works afterwards
"""


def test_a_rank_that_kills_its_process_group_kills_only_itself(tmp_path: Path) -> None:
    # In a process of its own session: were the ranks in the caller's group, the signal would
    # end that process only, not pytest.
    script = tmp_path / "killpg.py"
    script.write_text(_KILLPG)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=LONG_TIMEOUT_S,
        start_new_session=True,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "rank 1 of 2 died without reporting a result (killed by SIGKILL" in done.stdout
    assert done.stdout.strip().endswith("[0, 1]")


_SCRIPT = """
from distopt import launch
from distopt.engine.examples import allreduce_rank

print(launch(allreduce_rank, 2, timeout=60))
"""


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_without_a_main_guard_launches(how: str, tmp_path: Path) -> None:
    """The ranks do not run the caller's script again (multiprocessing would, as
    ``__mp_main__``), nor fail on ``<stdin>`` as a path."""
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    command = [sys.executable, str(script)] if how == "file" else [sys.executable, "-"]
    done = subprocess.run(
        command,
        input=_SCRIPT if how == "stdin" else None,
        capture_output=True,
        text=True,
        timeout=LONG_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (0, "[3.0, 3.0]\n"), done.stderr[-2000:]


def _receive_from_a_silent_peer(rank: int, world_size: int) -> int:
    """Rank 0 waits for a message rank 1 never sends; rank 1 returns."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        buffer = torch.zeros(3)
        dist.recv(buffer, src=1)  # the line the timeout's message must name
    return rank


def test_a_timeout_names_where_each_rank_waits() -> None:
    with pytest.raises(LaunchTimeout) as raised:
        launch(_receive_from_a_silent_peer, 2, timeout=5)
    message = str(raised.value)
    assert "ranks [0] of 2 had not finished" in message
    assert (
        "rank 0 waits in torch.distributed.recv, called at line "
        f"{_receive_from_a_silent_peer.__code__.co_firstlineno + 7} of "
        "_receive_from_a_silent_peer: dist.recv(buffer, src=1)"
    ) in message, message
    assert "dst= and src=" in message


def test_a_timeout_in_a_collective_names_it() -> None:
    with pytest.raises(LaunchTimeout) as raised:
        launch(hang_on_rank, 2, 1, timeout=5)
    message = str(raised.value)
    assert "waits in torch.distributed.all_reduce" in message, message
    assert "skips a collective" in message
