"""Tests of distopt.dist.record: every kind of call is logged with its bytes, op and peer."""

import torch
import torch.distributed as dist

from distopt import launch
from distopt.dist import record


def _traffic(rank: int, world_size: int) -> dict:
    x = torch.ones(10)  # 40 bytes
    with record.communication() as log:
        dist.all_reduce(x)
        dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True).wait()
        dist.broadcast(x, src=0)
        out = torch.empty(10 * world_size)
        dist.all_gather_into_tensor(out, x)
        shard = torch.empty(10)
        dist.reduce_scatter_tensor(shard, torch.ones(10 * world_size))
        peer = (rank + 1) % world_size
        sends = [dist.isend(x, peer), dist.irecv(torch.empty(10), (rank - 1) % world_size)]
        for work in sends:
            work.wait()
        dist.barrier()
    outside = torch.ones(1)
    dist.all_reduce(outside)  # after the block: not recorded, and the original works
    return {
        "calls": [(c.name, c.payload_bytes, c.op, c.peer, c.async_op) for c in log.calls],
        "times": [c.time_s for c in log.calls],
        "all_reduce_bytes": log.payload_bytes("all_reduce"),
        "summary": log.summary(),
    }


def test_each_call_is_logged_with_bytes_op_and_peer():
    per_rank = launch(_traffic, 2, timeout=60)
    for rank, got in enumerate(per_rank):
        assert got["calls"] == [
            ("all_reduce", 40, "SUM", None, False),
            ("all_reduce", 40, "AVG", None, True),
            ("broadcast", 40, None, 0, False),
            ("all_gather_into_tensor", 40, None, None, False),
            ("reduce_scatter_tensor", 80, "SUM", None, False),
            ("isend", 40, None, (rank + 1) % 2, True),
            ("irecv", 40, None, (rank - 1) % 2, True),
            ("barrier", 0, None, None, False),
        ], got["calls"]
        assert got["times"] == sorted(got["times"])
        assert got["all_reduce_bytes"] == 80
        assert "all_reduce: 2 call(s), 80 bytes" in got["summary"]


def _restored(rank: int, world_size: int) -> bool:
    before = dist.all_reduce
    try:
        with record.communication():
            assert dist.all_reduce is not before
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    return dist.all_reduce is before and record.c10d.all_reduce is before


def test_the_functions_are_put_back_even_after_an_error():
    assert launch(_restored, 2, timeout=60) == [True, True]
