"""Tests of distopt.engine.record: every kind of call is logged with its bytes, op and peer."""

import pytest
import torch
import torch.distributed as dist

from distopt import launch
from distopt.engine import record


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


def _overlap(rank: int, world_size: int) -> tuple[int, int, int]:
    layer = torch.nn.Linear(4, 4).double()
    works = []
    layer.weight.register_post_accumulate_grad_hook(
        lambda p: works.append(dist.all_reduce(p.grad, async_op=True))
    )
    with record.communication() as log:
        layer(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        for work in works:
            work.wait()
        dist.all_reduce(layer.bias.grad)  # after the backward pass
    return len(log.backward), len(log.during_backward("all_reduce")), log.count("all_reduce")


def test_calls_made_during_a_backward_pass_are_told_apart():
    assert launch(_overlap, 2, timeout=60) == [(1, 1, 2), (1, 1, 2)]


def _three_all_reduces(rank: int, world_size: int) -> int:
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    return rank


def test_traced_returns_each_ranks_value_and_recording():
    (v0, log0), (v1, log1) = launch(record.traced(_three_all_reduces), 2, timeout=60)
    assert (v0, v1) == (0, 1)
    assert log0.count("all_reduce") == log1.count("all_reduce") == 3
    assert log0.payload_bytes() == 3 * 2 * 4


def _blocking_point_to_point(rank: int, world_size: int) -> list[tuple[str, int, int | None]]:
    with record.communication() as log:
        if rank == 0:
            dist.send(torch.ones(5, dtype=torch.float64), dst=1)
        else:
            dist.recv(torch.empty(5, dtype=torch.float64), src=0)
    return [(c.name, c.payload_bytes, c.peer) for c in log.calls]


def test_a_blocking_send_is_logged_once_not_also_as_the_isend_inside_it():
    assert launch(_blocking_point_to_point, 2, timeout=60) == [
        [("send", 40, 1)],
        [("recv", 40, 0)],
    ]


def _batched_point_to_point(rank: int, world_size: int) -> list:
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    with record.communication() as log:
        ops = [
            dist.P2POp(dist.isend, torch.ones(3, dtype=torch.float64), right),
            dist.P2POp(dist.irecv, torch.empty(3, dtype=torch.float64), left),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return [(c.name, c.payload_bytes, c.peer) for c in log.calls]


def test_batch_isend_irecv_is_logged_with_its_peers():
    # torch passes the peers of a batch as group_dst / group_src, not dst / src
    assert launch(_batched_point_to_point, 3, timeout=60) == [
        [("isend", 24, 1), ("irecv", 24, 2)],
        [("isend", 24, 2), ("irecv", 24, 0)],
        [("isend", 24, 0), ("irecv", 24, 1)],
    ]


def test_messages_are_sorted_by_direction_and_collectives_apart():
    calls = [
        record.Call(name, 8, None, peer, name.startswith("i"), float(t))
        for t, (name, peer) in enumerate(
            [("isend", 1), ("recv", 2), ("all_reduce", None), ("send", 3), ("irecv", 0)]
        )
    ]
    log = record.Recording(calls=calls)
    assert [(c.name, c.peer) for c in log.sent()] == [("isend", 1), ("send", 3)]
    assert [(c.name, c.peer) for c in log.received()] == [("recv", 2), ("irecv", 0)]
    assert [c.name for c in log.collectives()] == ["all_reduce"]


def _all_to_all(rank: int, world_size: int) -> list:
    # rank r sends r + 1 rows of 3 float64 to every rank, then, evenly split, 2 rows of 2
    # float32 and (gloo's all_to_all takes equal parts only) 2 float32 to every rank
    rows = torch.ones((rank + 1) * world_size, 3, dtype=torch.float64)
    out = torch.empty(sum(r + 1 for r in range(world_size)), 3, dtype=torch.float64)
    with record.communication() as log:
        dist.all_to_all_single(
            out, rows, [r + 1 for r in range(world_size)], [rank + 1] * world_size
        )
        even = torch.ones(2 * world_size, 2)
        dist.all_to_all_single(torch.empty_like(even), even)
        parts = [torch.ones(2) for _ in range(world_size)]
        dist.all_to_all([torch.empty(2) for _ in range(world_size)], parts)
    return [(c.name, c.payload_bytes, c.peer_bytes) for c in log.calls]


def test_an_all_to_all_is_logged_with_its_bytes_to_each_rank():
    got = launch(_all_to_all, 3, timeout=60)
    for rank, calls in enumerate(got):
        assert calls == [
            ("all_to_all_single", 3 * (rank + 1) * 24, ((rank + 1) * 24,) * 3),
            ("all_to_all_single", 6 * 8, (16, 16, 16)),
            ("all_to_all", 3 * 8, (8, 8, 8)),
        ], calls


def test_each_block_is_appended_to_the_log_the_environment_names(tmp_path, monkeypatch):
    """The grader's message log (autograder.similarity): one JSON line per rank and block,
    with its rank, world size, times, and each call's name, bytes and peer."""
    import json

    path = tmp_path / "messages.jsonl"
    monkeypatch.setenv(record.LOG_ENV, str(path))
    per_rank = launch(_traffic, 2, timeout=60)
    lines = sorted((json.loads(x) for x in path.read_text().splitlines()), key=lambda x: x["rank"])
    assert [(x["rank"], x["world_size"]) for x in lines] == [(0, 2), (1, 2)]
    for x, got in zip(lines, per_rank, strict=True):
        assert x["calls"] == [[name, size, peer] for name, size, _, peer, _ in got["calls"]]
        assert x["began"] <= x["ended"]


# --- communication below the Python API --------------------------------------------------


def _by_route(rank: int, world_size: int) -> dict:
    """Each route to the process group inside its own block: what the block ended with."""
    import torch.distributed._functional_collectives as functional
    from torch.distributed import all_reduce as bound_before  # the original, not the wrapper

    routes = {
        "dist.all_reduce": lambda t: dist.all_reduce(t),
        "group.WORLD.allreduce": lambda t: dist.group.WORLD.allreduce([t]).wait(),
        "_get_default_group": lambda t: (
            dist.distributed_c10d._get_default_group().allreduce(t).wait()
        ),
        "functional": lambda t: functional.all_reduce(t, "sum", dist.group.WORLD) * 1,
        "bound before the block": lambda t: bound_before(t),
        "group.WORLD.send": lambda t: (
            dist.group.WORLD.send([t], 1 - rank, 0).wait()
            if rank == 0
            else dist.group.WORLD.recv([t], 0, 0).wait()
        ),
    }
    found = {}
    for name, route in routes.items():
        try:
            with record.communication() as log:
                route(torch.ones(4))
            found[name] = ("ok", log.names(), log.unseen)
        except record.UnseenCommunication as exc:
            found[name] = ("unseen", str(exc))
    with record.communication(unseen_allowed=True) as log:
        dist.group.WORLD.allreduce([torch.ones(4)]).wait()
    found["allowed"] = ("ok", log.names(), log.unseen)
    return found


def test_a_collective_by_any_route_the_recorder_does_not_log_fails_the_block():
    for rank, found in enumerate(launch(_by_route, 2, timeout=60)):
        assert found["dist.all_reduce"] == ("ok", ["all_reduce"], []), rank
        for name, op in [
            ("group.WORLD.allreduce", "c10d.allreduce_"),
            ("_get_default_group", "c10d.allreduce_"),
            ("functional", "_c10d_functional.all_reduce"),
            ("bound before the block", "c10d.allreduce_"),
            ("group.WORLD.send", "c10d.send" if rank == 0 else "c10d.recv_"),
        ]:
            outcome, message = found[name]
            assert outcome == "unseen" and f"{op} x1" in message, (rank, name, found[name])
            assert "dist.<name>" in message
        assert found["allowed"] == ("ok", [], ["c10d.allreduce_"]), rank


def _new_names_and_grad(rank: int, world_size: int) -> tuple:
    x = torch.ones(4)
    w = torch.ones(3, requires_grad=True)
    with record.communication() as log:
        dist.all_gather_single(torch.empty(4 * world_size), x)
        dist.reduce_scatter_single(torch.empty(4 // world_size), x)
        dist.all_gather_into_tensor(torch.empty(4 * world_size), x)
        (grad,) = torch.autograd.grad((w * 2).sum(), w)
    return (
        log.names(),
        log.count("all_gather_into_tensor"),
        log.count("all_gather_single"),
        log.payload_bytes("reduce_scatter_tensor"),
        len(log.backward),
        grad.tolist(),
    )


def test_torch_2_13s_names_count_as_the_old_ones_and_autograd_grad_as_a_backward_pass():
    assert hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single")
    for got in launch(_new_names_and_grad, 2, timeout=60):
        names, gathers, singles, scattered_bytes, backward_passes, grad = got
        assert names == ["all_gather_single", "reduce_scatter_single", "all_gather_into_tensor"]
        assert gathers == singles == 2 and scattered_bytes == 16
        assert backward_passes == 1 and grad == [2.0, 2.0, 2.0]


def _ddp(rank: int, world_size: int) -> tuple:
    """DDP's set-up and pre-forward syncs are torch's own; its reducer's all-reduce is not."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(rank)
    with record.communication(unseen_allowed=True) as log:
        model = DistributedDataParallel(torch.nn.Linear(3, 2))  # rank 0's weights broadcast
        for _ in range(2):  # the second forward agrees on the bucket order
            model(torch.ones(4, 3)).sum().backward()
    return log.names(), log.unseen, len(log.backward)


def test_ddp_set_up_is_torch_own_and_its_reducer_unseen():
    for names, unseen, backward_passes in launch(_ddp, 2, timeout=60):
        assert names == [] and backward_passes == 2
        assert unseen == ["c10d.allreduce_", "c10d.allreduce_"], unseen  # one bucket a step


def test_a_backward_pass_by_a_route_that_is_not_counted_ends_the_block():
    """The backward count is what the recorder's wrappers see; a pass started below them
    (the wrapper's ``__wrapped__``, the engine itself) is caught by the operators it runs."""
    x = torch.ones(3, requires_grad=True)
    routes = {
        "__wrapped__": lambda loss: torch.autograd.backward.__wrapped__(loss),
        "the engine": lambda loss: torch.autograd.Variable._execution_engine.run_backward(
            (loss,), (torch.ones(()),), False, False, (), True, True
        ),
    }
    for name, route in routes.items():
        with (
            pytest.raises(record.UnseenCommunication, match="1 backward pass"),
            record.communication() as log,
        ):
            route((x * 2).sum())
        assert log.unseen == [record.UNCOUNTED_BACKWARD], name
    with record.communication() as log:  # the counted routes, a checkpoint's rerun among them
        (x * 2).sum().backward()
        torch.autograd.grad((x * 3).sum(), x)
        torch.utils.checkpoint.checkpoint(
            lambda t: (t * t).sum(), x, use_reentrant=False
        ).backward()
    assert len(log.backward) == 3 and not log.unseen
