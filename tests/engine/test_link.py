"""Tests of distopt.engine.link: collectives timed by the alpha-beta model, FIFO on one link."""

import math
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distopt import launch
from distopt.costs import comm
from distopt.engine import link, record

ALPHA, BETA = 10e-6, 10e9  # 10 us, 10 GB/s
SCALE = 1000  # a 40 kB all-reduce on 2 ranks: 24 us modelled, 24 ms of wall time


def test_the_model_is_the_sections_alpha_beta_costs():
    m, kw = 1e6, dict(latency_s=ALPHA, bandwidth_bytes_per_s=BETA)
    for n in (2, 3, 8):
        assert link.duration_s("all_reduce", m, n, **kw) == comm.allreduce_time(
            m, n, bandwidth=BETA, latency=ALPHA
        )
        assert math.isclose(
            link.duration_s("all_gather_into_tensor", m, n, **kw),
            (n - 1) * ALPHA + (n - 1) / n * m / BETA,
        )
        assert math.isclose(link.duration_s("broadcast", m, n, **kw), (n - 1) * ALPHA + m / BETA)
        # the bytes term is the bus factor: bus bandwidth = beta whatever N
        bytes_s = link.duration_s("all_reduce", m, n, **kw) - 2 * (n - 1) * ALPHA
        assert math.isclose(comm.bus_bandwidth(m / bytes_s, n), BETA)
    assert link.duration_s("send", m, 5, **kw) == ALPHA + m / BETA
    assert link.duration_s("all_reduce", m, 1, **kw) == 0.0
    with pytest.raises(ValueError, match="no model"):
        link.duration_s("all_reduce_coalesced", m, 2, **kw)


def _blocking_and_async(rank: int, world_size: int) -> dict:
    before = dist.all_reduce
    x = torch.ones(10_000)  # 40 kB
    with link.emulated_link(ALPHA, BETA, time_scale=SCALE) as wire:
        dist.all_reduce(x)
        returned_s = time.perf_counter()
        first = dist.all_reduce(torch.ones(10_000), async_op=True)
        second = dist.all_reduce(torch.ones(10_000), async_op=True)
        issued_s = time.perf_counter()
        done_before = second.is_completed()
        first.wait()
        second.wait()
        waited_s = time.perf_counter()
        out = torch.empty(10_000 * world_size)
        dist.all_gather_into_tensor(out, torch.ones(10_000))
    a, b, c, d = wire.transfers
    return {
        "sum": float(x[0]),
        "blocking_ended": returned_s >= a.end_s,
        "async_returned_early": issued_s < b.start_s + (b.end_s - b.start_s) / 2,
        "not_done_before": not done_before,
        "fifo": b.start_s >= a.end_s and c.start_s == b.end_s,
        "wait_ended": waited_s >= c.end_s,
        "scaled": [t.end_s - t.start_s - SCALE * t.model_s for t in wire.transfers],
        "model_s": [t.model_s for t in wire.transfers],
        "bytes": [t.message_bytes for t in wire.transfers],
        "async": [t.async_op for t in wire.transfers],
        "restored": dist.all_reduce is before is c10d.all_reduce,
        "gather_bytes": d.message_bytes,
    }


def test_calls_end_when_the_model_says_in_fifo_order():
    for got in launch(_blocking_and_async, 2, timeout=60):
        assert got["sum"] == 2.0
        assert got["blocking_ended"] and got["wait_ended"] and got["fifo"]
        assert got["async_returned_early"] and got["not_done_before"]
        assert all(abs(d) < 1e-9 for d in got["scaled"]), got["scaled"]
        assert got["model_s"][0] == comm.allreduce_time(40_000, 2, bandwidth=BETA, latency=ALPHA)
        assert got["bytes"] == [40_000, 40_000, 40_000, 80_000]
        assert got["async"] == [False, True, True, False]
        assert got["restored"]


def _with_recorder(rank: int, world_size: int, link_outside: bool) -> tuple:
    before, peer = dist.all_reduce, 1 - rank
    with contextlib_nest(link_outside) as (log, wire):
        dist.all_reduce(torch.ones(4))
        if rank == 0:
            dist.send(torch.ones(5, dtype=torch.float64), dst=peer)
        else:
            dist.recv(torch.empty(5, dtype=torch.float64), src=peer)
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    names = [t.name for t in wire.transfers]
    back = dist.all_reduce is before is c10d.all_reduce
    return [c.name for c in log.calls], names, back


class contextlib_nest:  # noqa: N801
    """The recorder and the link, in either nesting order."""

    def __init__(self, link_outside: bool) -> None:
        self.link_outside = link_outside

    def __enter__(self):
        self.stack = __import__("contextlib").ExitStack()
        if self.link_outside:
            wire = self.stack.enter_context(link.emulated_link(ALPHA, BETA, time_scale=100))
            log = self.stack.enter_context(record.communication())
        else:
            log = self.stack.enter_context(record.communication())
            wire = self.stack.enter_context(link.emulated_link(ALPHA, BETA, time_scale=100))
        return log, wire

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


@pytest.mark.parametrize("link_outside", [True, False])
def test_the_link_and_the_recorder_nest_either_way(link_outside):
    per_rank = launch(_with_recorder, 2, link_outside, timeout=60)
    for rank, (logged, transfers, back) in enumerate(per_rank):
        message = "send" if rank == 0 else "recv"
        assert logged == ["all_reduce", message, "all_reduce"]  # the send once, not its isend
        assert transfers == ["all_reduce", message, "all_reduce"]
        assert back


def _ddp_with_hook(rank: int, world_size: int) -> tuple:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(50, 50), torch.nn.Linear(50, 2)).double()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    x = torch.full((4, 50), float(rank + 1), dtype=torch.float64)
    ddp(x).sum().backward()  # DDP's first step has one bucket; it rebuilds them after it
    model.zero_grad()
    with link.emulated_link(ALPHA, BETA, time_scale=SCALE) as wire:
        ddp(x).sum().backward()
        ended_s = time.perf_counter()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return grads, len(wire.transfers), ended_s >= max(t.end_s for t in wire.transfers)


def test_ddp_comm_hooks_go_over_the_link():
    (g0, n0, ended0), (g1, n1, ended1) = launch(_ddp_with_hook, 2, timeout=60)
    assert torch.equal(g0, g1)  # averaged
    assert n0 == n1 >= 2  # one all-reduce per bucket
    assert ended0 and ended1  # backward returned after the last modelled end


def _raises_inside(rank: int, world_size: int) -> bool:
    before = dist.all_reduce
    with pytest.raises(RuntimeError):
        with link.emulated_link(ALPHA, BETA):
            assert dist.all_reduce is not before
            raise RuntimeError("inside")
    return dist.all_reduce is before


def test_the_functions_are_put_back_even_after_an_error():
    assert launch(_raises_inside, 2, timeout=60) == [True, True]


def _profiled(rank: int, world_size: int) -> list[str]:
    with link.emulated_link(ALPHA, BETA, time_scale=SCALE), link.profiler() as prof:
        work = dist.all_reduce(torch.ones(10_000), async_op=True)
        torch.ones(300, 300) @ torch.ones(300, 300)
        work.wait()
    return [e.name for e in prof.events() if e.name.startswith("link:")]


def test_a_profiler_trace_has_a_range_for_each_transfer():
    assert launch(_profiled, 2, timeout=60) == [["link: all_reduce 40,000 B"]] * 2


def _in_group_of(rank: int, world_size: int) -> float:
    group = dist.new_group([0, 1])
    with link.emulated_link(ALPHA, BETA, time_scale=SCALE) as wire:
        if rank < 2:
            dist.all_reduce(torch.ones(1000), group=group)
        dist.all_reduce(torch.ones(1000))
    return [t.world_size for t in wire.transfers]


def test_the_model_prices_the_calls_group():
    assert launch(_in_group_of, 3, timeout=60) == [[2, 3], [2, 3], [3]]


def test_late_lists_the_transfers_whose_real_op_outlasted_the_model():
    wire = link.Link(ALPHA, BETA, 1.0)
    wire.transfers = [
        link.Transfer("all_reduce", 8, 2, False, 0.0, 0.0, 1.0, 1.0, done_s=0.5),
        link.Transfer("all_reduce", 8, 2, True, 0.1, 1.0, 2.0, 1.0, done_s=2.5),
        link.Transfer("all_reduce", 8, 2, True, 0.2, 2.0, 3.0, 1.0),  # never waited on
    ]
    assert wire.late() == [wire.transfers[1]]
    assert wire.late(slack_s=1.0) == []
    assert wire.busy_s() == 3.0 and wire.busy_s("broadcast") == 0.0


def test_linked_wraps_rank_code_and_returns_the_link():
    per_rank = launch(link.linked(_three_all_reduces, ALPHA, BETA, time_scale=10), 2, timeout=60)
    for value, wire in per_rank:
        assert value == 3 and [t.name for t in wire.transfers] == ["all_reduce"] * 3
        assert wire.time_scale == 10 and wire.latency_s == ALPHA


def _three_all_reduces(rank: int, world_size: int) -> int:
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    return 3


def test_the_link_holds_no_reader_of_step_timelines():
    """Reading a run's steps is section 01's exercise 10: not in the package (issue 53)."""
    assert not hasattr(link, "step_timelines") and not hasattr(link, "StepTimeline")


def test_the_sections_rank_code_on_the_link():
    from distopt.ranks import timeline_ranks

    config = link.LinkConfig(ALPHA, BETA, time_scale=100)
    bus = launch(timeline_ranks.bus_bandwidth, 3, config, 400_000, (2, 3), timeout=60)[0]
    for n, row in bus.items():
        assert row["model_s"] == config.duration_s("all_reduce", 400_000, n)
        assert row["time_s"] >= 100 * row["model_s"]
    value, log, wire, trace = launch(timeline_ranks.profiled, 2, config, _linear_step, 3)[0]
    assert value == 3 and len(log.backward) == 3 and len(wire.of("all_reduce")) == 3
    assert trace is not None and trace.count('"link: all_reduce 4 B"') == 3


def _linear_step(rank: int, world_size: int, steps: int) -> int:
    model = torch.nn.Linear(1, 1, bias=False)
    for _ in range(steps):
        model(torch.ones(1)).sum().backward()
        dist.all_reduce(model.weight.grad, async_op=True).wait()
    return steps
