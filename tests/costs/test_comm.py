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


# Section 01: N not a power of two, NCCL's double binary tree, the two-level all-reduce.


def _fold_and_run(n, m_values, halving):
    """Recursive doubling (halving=False) or Rabenseifner (True) on n ranks holding vectors,
    with MPICH's reduction to N' = 2**floor(log2 n) ranks. Returns every rank's result and,
    for the rank that waits longest, (messages, values) on its critical path."""
    rng = np.random.default_rng(n)
    data = [rng.standard_normal(m_values) for _ in range(n)]
    core = 2 ** (n.bit_length() - 1)
    buf = [d.copy() for d in data[:core]]
    messages = values = 0
    if core < n:  # the extra ranks send their whole buffer in
        for r in range(core, n):
            buf[r - core] += data[r]
        messages, values = messages + 1, values + m_values
    if not halving:
        step = 1
        while step < core:
            buf = [buf[r] + buf[r ^ step] for r in range(core)]
            messages, values, step = messages + 1, values + m_values, step * 2
    else:
        lo, hi = [0] * core, [m_values] * core  # the part of the vector each rank still reduces
        step = core // 2
        while step >= 1:  # reduce-scatter by recursive halving
            new = [b.copy() for b in buf]
            for r in range(core):
                mid = (lo[r] + hi[r]) // 2
                keep = (lo[r], mid) if r & step == 0 else (mid, hi[r])
                new[r][keep[0] : keep[1]] += buf[r ^ step][keep[0] : keep[1]]
                lo[r], hi[r] = keep
            messages, values = messages + 1, values + (hi[0] - lo[0])
            buf, step = new, step // 2
        step = 1
        while step < core:  # all-gather by recursive doubling
            new = [b.copy() for b in buf]
            for r in range(core):
                p = r ^ step
                new[r][lo[p] : hi[p]] = buf[p][lo[p] : hi[p]]
            sent = hi[0] - lo[0]
            for r in range(core):
                p = r ^ step
                lo[r], hi[r] = min(lo[r], lo[p]), max(hi[r], hi[p])
            messages, values = messages + 1, values + sent
            buf, step = new, step * 2
    result = buf + [buf[r - core].copy() for r in range(core, n)]  # the result sent back out
    if core < n:
        messages, values = messages + 1, values + m_values
    assert all(np.allclose(x, sum(data)) for x in result)
    return messages, values / m_values


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 13])
def test_non_powers_of_two_fold_the_extra_ranks_in_and_out(n):
    m = 2 ** (n.bit_length() - 1) * 6  # divides into N' halves
    for algorithm, halving in (("recursive_doubling", False), ("rabenseifner", True)):
        a, b = comm.allreduce_cost_terms(n, algorithm)
        assert (a, b) == pytest.approx(_fold_and_run(n, m, halving)), (n, algorithm)
    core = 2 ** (n.bit_length() - 1)
    extra = 0 if core == n else 2
    for algorithm in ("recursive_doubling", "rabenseifner"):
        a, b = comm.allreduce_cost_terms(n, algorithm)
        a_core, b_core = comm.allreduce_cost_terms(core, algorithm)
        assert (a, b) == pytest.approx((a_core + extra, b_core + extra))


def test_without_a_power_of_two_the_ring_beats_rabenseifner_on_large_messages():
    kw = dict(bandwidth=gbit_per_s(400), latency=10e-6)
    rab = dict(kw, algorithm="rabenseifner")
    assert comm.allreduce_time(1 * GB, 96, **rab) > comm.allreduce_time(1 * GB, 96, **kw)
    assert comm.allreduce_time(1 * GB, 128, **rab) < comm.allreduce_time(1 * GB, 128, **kw)


def test_double_binary_tree_has_tree_latency_and_about_the_rings_bandwidth():
    m, bw, lat = 1e9, 5e10, 1e-5
    for n in (2, 3, 8, 100, 1024):
        rounds = int(np.ceil(np.log2(n)))
        got = comm.allreduce_time(m, n, bandwidth=bw, latency=lat, algorithm="double_binary_tree")
        assert got == pytest.approx(2 * rounds * lat + 2 * m / bw)
    ring = comm.allreduce_time(1e3, 1024, bandwidth=bw, latency=lat)
    tree = comm.allreduce_time(1e3, 1024, bandwidth=bw, latency=lat, algorithm="double_binary_tree")
    assert tree < ring / 10  # small messages: 20 latencies against 2046


def test_hierarchical_allreduce_is_its_three_phases():
    m, fast, slow, a_in, a_out = 1e9, 450e9, gbit_per_s(400), 2e-6, 10e-6
    got = comm.hierarchical_allreduce_time(
        m, 8, 8, intra_bandwidth=fast, inter_bandwidth=slow, intra_latency=a_in, inter_latency=a_out
    )
    inside = 2 * 7 * a_in + 2 * 7 / 8 * m / fast  # reduce-scatter + all-gather in the server
    across = 2 * 7 * a_out + 2 * 7 / 8 * (m / 8) / slow  # 1/8 of the buffer, ring of 8 servers
    assert got == pytest.approx(inside + across)
    flat = comm.allreduce_time(m, 64, bandwidth=slow, latency=a_out)  # every hop as slow
    assert got < flat / 4
    # one alpha and beta everywhere: the ring's bytes, 2(G-1) + 2(S-1) latencies
    one = dict(bandwidth=slow, latency=a_out, algorithm="hierarchical", gpus_per_server=8)
    assert comm.allreduce_time(m, 64, **one) == pytest.approx(
        28 * a_out + 2 * 63 / 64 * m / slow, rel=1e-12
    )
    assert comm.allreduce_cost_terms(64, "hierarchical") == pytest.approx((28, 2 * 63 / 64))
    assert comm.allreduce_time(m, 4, **one) == comm.allreduce_time(
        m, 4, bandwidth=slow, latency=a_out
    )
    with pytest.raises(ValueError, match="multiple"):
        comm.allreduce_time(m, 12, **one)


@pytest.mark.parametrize("world_size", [2, 3, 8, 64, 1000])
def test_library_cost_terms_give_allreduce_time(world_size):
    m, bw, lat = 3e7, 2e10, 7e-6
    for algorithm in comm.LIBRARY_ALLREDUCE_ALGORITHMS:
        a, b = comm.allreduce_cost_terms(world_size, algorithm)
        got = comm.allreduce_time(m, world_size, bandwidth=bw, latency=lat, algorithm=algorithm)
        assert got == pytest.approx(a * lat + b * m / bw, rel=1e-12), algorithm


def test_sharded_step_options_trade_memory_for_fewer_transfers():
    n, ws, m = 1e9, 8, 8
    share = 7 / 8 * 2e9  # one all-gather or reduce-scatter of 2-byte values over 8 ranks

    def sent(stage, **options):
        return comm.sharded_step_bytes_sent(n, zero_stage=stage, world_size=ws, micro_batches=m,
                                            **options)  # fmt: skip

    # accumulating the gradients in a full buffer: one reduce-scatter per step
    assert sent(2, accumulate_unsharded=True) == pytest.approx(sent(1))
    assert sent(3, accumulate_unsharded=True) == pytest.approx((2 * m + 1) * share)
    assert sent(1, accumulate_unsharded=True) == sent(1)  # stages 0-1 accumulate anyway
    # reshard_after_forward=False: no second gather in the backward pass
    assert sent(3, reshard_after_forward=False) == pytest.approx(2 * m * share)
    assert sent(2, reshard_after_forward=False) == sent(2)  # stage 2 never reshards
    # the defaults are today's results
    for stage in range(4):
        assert sent(stage, accumulate_unsharded=False, reshard_after_forward=True,
                    shard_size=None) == sent(stage)  # fmt: skip


def test_hsdp_keeps_gathers_in_the_server_and_all_reduces_a_shard_across():
    n, ws, gpus = 1e9, 64, 8
    t = comm.sharded_step_traffic(n, zero_stage=3, world_size=ws, shard_size=gpus,
                                  micro_batches=4)  # fmt: skip
    assert t["shard"] == pytest.approx(4 * 3 * 7 / 8 * 2e9)  # 3 transfers per micro-batch, in 8
    # each micro-batch's gradient shard (2e9 / 8 bytes) ring all-reduced over the 8 servers
    assert t["replicate"] == pytest.approx(4 * 2 * 7 / 8 * 2e9 / 8)
    assert t["pcie"] == 0
    total = comm.sharded_step_bytes_sent(n, zero_stage=3, world_size=ws, shard_size=gpus,
                                         micro_batches=4)  # fmt: skip
    assert total == pytest.approx(t["shard"] + t["replicate"])
    # one server: HSDP is plain ZeRO-3
    flat = comm.sharded_step_traffic(n, zero_stage=3, world_size=gpus, shard_size=gpus)
    assert flat["replicate"] == 0
    assert flat["shard"] == comm.sharded_step_bytes_sent(n, zero_stage=3, world_size=gpus)
    with pytest.raises(ValueError, match="shard_size"):
        comm.sharded_step_traffic(n, zero_stage=3, world_size=ws, shard_size=5)
    with pytest.raises(ValueError, match="stage 0"):
        comm.sharded_step_traffic(n, zero_stage=0, world_size=ws, shard_size=gpus)


def test_offload_moves_gradient_shards_down_and_weight_shards_up_over_pcie():
    n, ws, m = 1e9, 8, 4
    t = comm.sharded_step_traffic(n, zero_stage=3, world_size=ws, micro_batches=m, offload=True)
    assert t["pcie"] == pytest.approx(m * 2e9 / 8 + 2e9 / 8)
    plain = comm.sharded_step_traffic(n, zero_stage=3, world_size=ws, micro_batches=m)
    assert t["shard"] == plain["shard"]  # the network traffic is unchanged
    accumulated = comm.sharded_step_traffic(n, zero_stage=2, world_size=ws, micro_batches=m,
                                            offload=True, accumulate_unsharded=True)  # fmt: skip
    assert accumulated["pcie"] == pytest.approx(2 * 2e9 / 8)
