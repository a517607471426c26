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
