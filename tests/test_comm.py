import pytest

from distopt import comm
from distopt.units import GB, gbit_per_s


def test_lesson_ring_allreduce_estimate():
    grad_bytes = 70e9 * 2
    t = comm.allreduce_time(grad_bytes, 64, bandwidth=gbit_per_s(400))
    assert round(t, 1) == 5.5
    assert t == pytest.approx(2 * 63 / 64 * 140e9 / 50e9)


def test_ring_bytes_sent_approaches_twice_the_message():
    assert comm.ring_allreduce_bytes_sent(100, 1) == 0
    assert comm.ring_allreduce_bytes_sent(100, 2) == 100
    assert comm.ring_allreduce_bytes_sent(100, 4) == 150
    assert comm.ring_allreduce_bytes_sent(100, 1024) == pytest.approx(200, rel=1e-3)


def test_latency_terms():
    m, bw, lat = 1e6, 1e9, 1e-5
    assert comm.allreduce_time(m, 8, bandwidth=bw, latency=lat) == pytest.approx(
        14 * lat + 2 * 7 / 8 * m / bw
    )
    assert comm.allreduce_time(
        m, 8, bandwidth=bw, latency=lat, algorithm="recursive_doubling"
    ) == pytest.approx(3 * (lat + m / bw))
    # small messages: recursive doubling wins; large ones: the ring wins
    small, large = 1e3, 1e9
    rd = dict(bandwidth=bw, latency=lat, algorithm="recursive_doubling")
    assert comm.allreduce_time(small, 64, **rd) < comm.allreduce_time(
        small, 64, bandwidth=bw, latency=lat
    )
    assert comm.allreduce_time(large, 64, **rd) > comm.allreduce_time(
        large, 64, bandwidth=bw, latency=lat
    )
    assert comm.allreduce_time(m, 1, bandwidth=bw, latency=lat) == 0


@pytest.mark.parametrize(
    "bad",
    [dict(bandwidth=0), dict(bandwidth=1, latency=-1), dict(bandwidth=1, algorithm="tree-ish")],
)
def test_allreduce_time_refuses_bad_input(bad):
    with pytest.raises(ValueError):
        comm.allreduce_time(10, 4, **bad)


def test_bus_bandwidth_matches_nccl_tests_convention():
    assert comm.bus_bandwidth(100, 8) == pytest.approx(175)
    assert comm.bus_bandwidth(100, 8, "all_gather") == pytest.approx(87.5)
    assert comm.bus_bandwidth(100, 8, "reduce_scatter") == pytest.approx(87.5)
    assert comm.bus_bandwidth(100, 8, "broadcast") == 100
    with pytest.raises(ValueError, match="collective"):
        comm.bus_bandwidth(100, 8, "gossip")


def test_sharding_communication_price():
    n, ws = 70e9, 64
    base = comm.sharded_step_bytes_sent(n, zero_stage=0, world_size=ws)
    assert base / GB == pytest.approx(275.625)
    for stage in (1, 2):
        assert comm.sharded_step_bytes_sent(n, zero_stage=stage, world_size=ws) == base
    assert comm.sharded_step_bytes_sent(n, zero_stage=3, world_size=ws) == pytest.approx(1.5 * base)
