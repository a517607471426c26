"""Tests of distopt.costs.prefetch: FSDP's prefetched gathers against per-layer compute."""

import pytest

from distopt.costs import prefetch


def test_two_layers_by_hand():
    # gather = (N-1)/N p w / B, compute = 2 p T / F, with N=2, w=2, B=100, T=10, F=1000
    rows = prefetch.prefetch_overlap([100, 200], 10, 2, flops_per_s=1000, bandwidth=100)
    assert [r.layer for r in rows] == [0, 1]
    assert [r.gather_s for r in rows] == [1.0, 2.0]
    assert [r.compute_s for r in rows] == [2.0, 4.0]
    # layer 0 has nothing to hide behind; layer 1's 2 s gather runs under layer 0's 2 s
    assert [r.exposed_s for r in rows] == [1.0, 0.0]


def test_without_prefetch_every_gather_is_exposed():
    rows = prefetch.prefetch_overlap(
        [100, 200, 50], 10, 2, flops_per_s=1000, bandwidth=100, prefetch=False
    )
    assert [r.exposed_s for r in rows] == [r.gather_s for r in rows] == [1.0, 2.0, 0.5]


def test_a_big_layer_after_a_small_one_is_partly_exposed():
    rows = prefetch.prefetch_overlap([10, 1000], 10, 2, flops_per_s=1000, bandwidth=100)
    # layer 1's gather: 0.5 x 2000 / 100 = 10 s, behind 2 x 10 x 10 / 1000 = 0.2 s of compute
    assert rows[1].exposed_s == pytest.approx(10 - 0.2)


@pytest.mark.parametrize("world_size", [2, 8, 64])
def test_equal_layers_hide_from_the_threshold_on(world_size):
    kw = dict(flops_per_s=4e14, bandwidth=50e9)
    threshold = prefetch.tokens_to_hide_gather(world_size, **kw)
    assert threshold == pytest.approx((world_size - 1) / world_size * 2 * 4e14 / (2 * 50e9))
    layers = [12 * 2048**2] * 6
    at = prefetch.prefetch_overlap(layers, threshold, world_size, **kw)
    assert all(r.exposed_s == pytest.approx(0, abs=1e-15) for r in at[1:])
    below = prefetch.prefetch_overlap(layers, 0.9 * threshold, world_size, **kw)
    assert all(r.exposed_s > 0 for r in below)
    above = prefetch.prefetch_overlap(layers, 1.1 * threshold, world_size, **kw)
    assert all(r.exposed_s == 0 for r in above[1:])
    assert above[0].exposed_s == above[0].gather_s  # the first gather always waits


def test_one_device_gathers_nothing():
    rows = prefetch.prefetch_overlap([5, 5], 3, 1, flops_per_s=1, bandwidth=1)
    assert all(r.gather_s == 0 and r.exposed_s == 0 for r in rows)
    assert prefetch.tokens_to_hide_gather(1, flops_per_s=1e15, bandwidth=1e9) == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(layer_num_params=[]),
        dict(layer_num_params=[-1]),
        dict(world_size=0),
        dict(tokens=0),
        dict(flops_per_s=0),
        dict(bandwidth=-1),
    ],
)
def test_bad_arguments_are_refused(bad):
    kw = dict(layer_num_params=[1, 2], tokens=4, world_size=2, flops_per_s=1.0, bandwidth=1.0)
    kw.update(bad)
    with pytest.raises(ValueError):
        prefetch.prefetch_overlap(
            kw.pop("layer_num_params"), kw.pop("tokens"), kw.pop("world_size"), **kw
        )


@pytest.mark.parametrize("bad", [dict(world_size=0), dict(flops_per_s=0), dict(bandwidth=0)])
def test_threshold_refuses_bad_arguments(bad):
    kw = dict(world_size=2, flops_per_s=1.0, bandwidth=1.0)
    kw.update(bad)
    with pytest.raises(ValueError):
        prefetch.tokens_to_hide_gather(kw.pop("world_size"), **kw)


# --- a whole fully sharded step: forward and backward, compute stream and link -------------

# gathers (N=2, w=2, B=100): 1 s and 2 s; forward 2 s and 4 s, backward twice that;
# reduce-scatters as long as the gathers (gradients as wide as weights)
BY_HAND = dict(layer_num_params=[100, 200], tokens=10, world_size=2, flops_per_s=1000,
               bandwidth=100)  # fmt: skip


def _step(prefetch_on=True, **overrides):
    kw = {**BY_HAND, **overrides}
    return prefetch.fully_sharded_step_seconds(
        kw.pop("layer_num_params"), kw.pop("tokens"), kw.pop("world_size"), prefetch=prefetch_on,
        **kw,
    )  # fmt: skip


def test_step_by_hand():
    # without prefetch: 2 gathers per layer + forward + backward + reduce-scatter, in a row
    assert _step(False) == (2 * 1 + 2 + 4 + 1) + (2 * 2 + 4 + 8 + 2)
    # with prefetch every gather hides but the first, and the last reduce-scatter (layer 0's)
    # runs after the last computation: 1 + (2 + 4 + 8 + 4) + 1
    assert _step(True) == 20


def test_without_prefetch_the_step_is_the_sum_of_its_parts():
    layers, n, bw, flops, tokens = [3e6, 7e5, 1.2e7, 4e6], 8, 5e10, 4e14, 2048
    gathers = [(n - 1) / n * 2 * p / bw for p in layers]
    forward = [2 * p * tokens / flops for p in layers]
    expected = 2 * sum(gathers) + 3 * sum(forward) + sum(gathers)  # reduce-scatters: as gathers
    got = prefetch.fully_sharded_step_seconds(layers, tokens, n, flops_per_s=flops, bandwidth=bw,
                                              prefetch=False)  # fmt: skip
    assert got == pytest.approx(expected, rel=1e-12)


def test_compute_bound_step_exposes_the_first_gather_and_the_last_reduce_scatter():
    layers = [12 * 2048**2] * 6
    kw = dict(flops_per_s=4e14, bandwidth=50e9)
    tokens = 10 * prefetch.tokens_to_hide_gather(8, **kw)  # gathers hide with room to spare
    step = prefetch.fully_sharded_step_seconds(layers, tokens, 8, **kw)
    one_transfer = 7 / 8 * 2 * layers[0] / kw["bandwidth"]
    compute = 3 * sum(2 * p * tokens / kw["flops_per_s"] for p in layers)
    assert step == pytest.approx(one_transfer + compute + one_transfer, rel=1e-12)


def test_link_bound_step_is_the_link_busy_all_the_time():
    layers = [5e6, 2e6, 9e6]
    kw = dict(flops_per_s=1e18, bandwidth=1e9)  # compute is next to nothing
    step = prefetch.fully_sharded_step_seconds(layers, 1024, 4, **kw)
    link = sum(3 * 3 / 4 * 2 * p / kw["bandwidth"] for p in layers)  # 2 gathers + 1 RS each
    assert step == pytest.approx(link, rel=1e-6)
    assert step >= link * (1 - 1e-12)  # the link never idles: the reduce-scatters queue


def test_prefetch_never_slows_a_step_and_one_device_only_computes():
    import random

    rng = random.Random(3)
    for _ in range(200):
        layers = [rng.uniform(1e5, 1e8) for _ in range(rng.randrange(1, 12))]
        kw = dict(flops_per_s=rng.uniform(1e13, 1e15), bandwidth=rng.uniform(1e9, 1e12),
                  grad_bytes=rng.choice([2, 4]))  # fmt: skip
        tokens, n = rng.choice([128, 1024, 8192]), rng.choice([2, 8, 64])
        on = prefetch.fully_sharded_step_seconds(layers, tokens, n, **kw)
        off = prefetch.fully_sharded_step_seconds(layers, tokens, n, prefetch=False, **kw)
        assert on <= off * (1 + 1e-12)
        compute = 3 * sum(2 * p * tokens / kw["flops_per_s"] for p in layers)
        assert on >= compute
        alone = prefetch.fully_sharded_step_seconds(layers, tokens, 1, **kw)
        assert alone == pytest.approx(compute, rel=1e-12)


def test_step_refuses_bad_arguments():
    for bad in (dict(layer_num_params=[]), dict(layer_num_params=[-1]), dict(world_size=0),
                dict(tokens=0), dict(bandwidth=0)):  # fmt: skip
        with pytest.raises(ValueError):
            _step(**bad)
