"""distopt.launch_map: independent calls shared among processes, values in the items' order."""

from __future__ import annotations

import pytest

from distopt import LaunchError, launch_map


def _square_and_pid(x: int) -> tuple[int, int]:
    import os

    return x * x, os.getpid()


def test_values_come_back_in_the_items_order_from_as_many_processes_as_asked():
    values = launch_map(_square_and_pid, range(7), processes=3)
    assert [v for v, _ in values] == [x * x for x in range(7)]
    pids = [pid for _, pid in values]
    assert len(set(pids)) == 3 and pids[0] == pids[3] == pids[6], pids  # item i on process i % 3


def test_no_more_processes_than_items_and_none_for_no_items():
    assert len({pid for _, pid in launch_map(_square_and_pid, [1, 2], processes=8)}) == 2
    assert launch_map(_square_and_pid, []) == []


def test_a_failing_item_is_reported_with_its_error():
    def fails_on_three(x: int) -> int:
        if x == 3:
            raise ValueError(f"item {x} is bad")
        return x

    with pytest.raises(LaunchError, match="item 3 is bad"):
        launch_map(fails_on_three, range(4), processes=2)


def test_a_fork_server_started_early_serves_the_launches():
    from multiprocessing import forkserver

    from distopt.engine.launcher import start_fork_server

    start_fork_server()
    pid = forkserver._forkserver._forkserver_pid
    assert pid is not None
    start_fork_server()  # again: the same server
    assert forkserver._forkserver._forkserver_pid == pid
    assert launch_map(_square_and_pid, [2, 3]) and forkserver._forkserver._forkserver_pid == pid
