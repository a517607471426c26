import numpy as np
import pytest

from distopt.costs import comm
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


def test_micro_batches_multiply_the_traffic_of_stages_2_and_3_only():
    n, ws, m = 1e9, 8, 8
    share = 7 / 8 * 2e9  # one all-gather or reduce-scatter of 2-byte values
    sent = {s: comm.sharded_step_bytes_sent(n, zero_stage=s, world_size=ws, micro_batches=m)
            for s in range(4)}  # fmt: skip
    assert sent[0] == pytest.approx(2 * share)  # one all-reduce of the accumulated gradients
    assert sent[1] == pytest.approx(2 * share)
    assert sent[2] == pytest.approx((m + 1) * share)  # a reduce-scatter per micro-batch
    assert sent[3] == pytest.approx(3 * m * share)  # gather, gather, reduce-scatter each
    # GPT-3 on a tensor-8 x data-8 layout, 8 micro-batches: about 0.9 TB per GPU per step
    gpt3_shard = 174.6e9 / 8
    tb = comm.sharded_step_bytes_sent(gpt3_shard, zero_stage=3, world_size=8, micro_batches=8)
    assert tb / 1e12 == pytest.approx(0.92, abs=0.01)
    with pytest.raises(ValueError, match="micro_batches"):
        comm.sharded_step_bytes_sent(n, zero_stage=2, world_size=ws, micro_batches=0)


# Section 01: the naive algorithms and the fit of alpha and beta.


@pytest.mark.parametrize("world_size", [2, 3, 8, 64, 1000])
def test_cost_terms_give_allreduce_time(world_size):
    m, bw, lat = 3e7, 2e10, 7e-6
    for algorithm in comm.ALLREDUCE_ALGORITHMS:
        a, b = comm.allreduce_cost_terms(world_size, algorithm)
        expected = a * lat + b * m / bw
        got = comm.allreduce_time(m, world_size, bandwidth=bw, latency=lat, algorithm=algorithm)
        assert got == pytest.approx(expected, rel=1e-12), algorithm


def test_naive_algorithms_match_their_descriptions():
    m, bw, lat = 1e6, 1e9, 1e-5
    # tree: reduce up 3 levels, broadcast down 3 levels, whole messages
    assert comm.allreduce_time(m, 8, bandwidth=bw, latency=lat, algorithm="tree") == pytest.approx(
        6 * (lat + m / bw)
    )
    # parameter server: 7 messages in, 7 copies out, one after the other
    assert comm.allreduce_time(
        m, 8, bandwidth=bw, latency=lat, algorithm="parameter_server"
    ) == pytest.approx(14 * (lat + m / bw))
    for algorithm in comm.ALLREDUCE_ALGORITHMS:
        assert comm.allreduce_time(m, 1, bandwidth=bw, latency=lat, algorithm=algorithm) == 0


def test_rabenseifner_has_the_rings_bandwidth_and_logarithmic_latency():
    m, bw, lat = 1e8, 1e10, 1e-5
    for n in (2, 8, 64, 1024):
        rab = comm.allreduce_time(m, n, bandwidth=bw, latency=lat, algorithm="rabenseifner")
        ring = comm.allreduce_time(m, n, bandwidth=bw, latency=lat)
        rounds = {2: 1, 8: 3, 64: 6, 1024: 10}[n]
        assert rab == pytest.approx(2 * rounds * lat + 2 * (n - 1) / n * m / bw)
        assert rab <= ring  # equal at N = 2, where both take two steps
    tiny = dict(bandwidth=bw, latency=lat)
    # for tiny messages recursive doubling's single pass of latencies still wins
    assert comm.allreduce_time(1e3, 64, algorithm="recursive_doubling", **tiny) < (
        comm.allreduce_time(1e3, 64, algorithm="rabenseifner", **tiny)
    )


def test_ring_never_loses_to_the_parameter_server():
    for n in (2, 5, 64):
        for m in (1.0, 1e4, 1e9):
            kw = dict(bandwidth=1e10, latency=1e-5)
            ring = comm.allreduce_time(m, n, **kw)
            assert ring <= comm.allreduce_time(m, n, algorithm="parameter_server", **kw)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "parameter_server"])
def test_fit_alpha_beta_recovers_exact_parameters(algorithm):
    sizes = np.geomspace(1e3, 1e8, 11)
    alpha, beta = 3e-5, 2.5e9
    times = [
        comm.allreduce_time(m, 4, bandwidth=beta, latency=alpha, algorithm=algorithm) for m in sizes
    ]
    got_alpha, got_beta = comm.fit_alpha_beta(sizes, times, world_size=4, algorithm=algorithm)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)
    assert got_beta == pytest.approx(beta, rel=1e-9)


def test_fit_alpha_beta_weighs_relative_errors():
    """With 10% noise on every point, both parameters come back within ~10%."""
    rng = np.random.default_rng(0)
    sizes = np.geomspace(1e3, 1e8, 21)
    alpha, beta = 1e-4, 1e9
    times = np.array([comm.allreduce_time(m, 2, bandwidth=beta, latency=alpha) for m in sizes])
    noisy = times * (1 + 0.1 * rng.uniform(-1, 1, len(sizes)))
    got_alpha, got_beta = comm.fit_alpha_beta(sizes, noisy, world_size=2)
    assert got_alpha == pytest.approx(alpha, rel=0.15)
    assert got_beta == pytest.approx(beta, rel=0.15)


def test_fit_alpha_beta_refuses_bad_input():
    with pytest.raises(ValueError):
        comm.fit_alpha_beta([1e3, 1e4], [1e-3], world_size=2)
    with pytest.raises(ValueError):
        comm.fit_alpha_beta([1e3, 1e4], [1e-3, 0.0], world_size=2)
    with pytest.raises(ValueError):
        comm.fit_alpha_beta([1e3, 1e4], [1e-3, 2e-3], world_size=1)
