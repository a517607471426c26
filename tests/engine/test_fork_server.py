"""distopt.engine.fork_server: a fork server started early, from a process that imported torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WARM_START = """
import json, os, threading, time
import torch, torch._dynamo, torch.distributed  # noqa: F401  (what the fork server imports)
from multiprocessing import forkserver
from distopt import launch
from distopt.engine import fork_server

def seen(rank, world_size):
    return {"parent": os.getppid(), "late": os.environ.get("DISTOPT_LATE")}

release = threading.Event()
thread = threading.Thread(target=release.wait)
thread.start()
threaded = fork_server.start_here()
release.set()
thread.join()
while len(os.listdir("/proc/self/task")) > 1:  # the thread's task ends just after join
    time.sleep(0.01)
started = fork_server.start_here()
again = fork_server.start_here()
os.environ["DISTOPT_LATE"] = "set after the server started"
ranks = launch(seen, 2, timeout=60)
server = forkserver._forkserver._forkserver_pid
print(json.dumps({"threaded": threaded, "started": started, "again": again,
                  "server": server, "ranks": ranks}))
"""


def test_a_fork_server_started_early_serves_ranks_with_the_callers_environment_at_launch(
    tmp_path: Path,
) -> None:
    """The autograder's warm kernels start the server before they run threads (zygote.py)."""
    script = tmp_path / "warm_start.py"
    script.write_text(WARM_START)
    # One OpenMP thread, as in the autograder's kernels: with more, importing torch starts a
    # thread, and the process is no longer one a server may be forked from.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["threaded"], seen["started"], seen["again"]) == (False, True, False)
    assert [rank["parent"] for rank in seen["ranks"]] == [seen["server"]] * 2
    assert {rank["late"] for rank in seen["ranks"]} == {"set after the server started"}
