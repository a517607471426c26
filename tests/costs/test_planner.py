"""Tests of distopt.costs.planner: the enumeration, the memory filter and the ranking."""

import dataclasses
import math

import pytest

from distopt.costs import comm, memory, shape, transformer
from distopt.costs.planner import (
    USABLE_FRACTION,
    ClusterSpec,
    Layout,
    ModelSpec,
    data_parallel_seconds,
    group_spans,
    layouts,
    memory_per_gpu,
    mfu,
    plan,
    rank_key,
    step_time_breakdown,
    traffic_bytes,
    training_flops,
)
from distopt.units import GB, H100_MEMORY_BYTES, gbit_per_s

CLUSTER = ClusterSpec(64, 8, H100_MEMORY_BYTES, 450 * GB, gbit_per_s(400), 400e12)
ONE_B = ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048)
GPT3 = ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048)


def test_layouts_cover_the_cluster():
    found = list(layouts(ONE_B, CLUSTER, 512))
    assert found
    for layout in found:
        assert layout.tensor * layout.pipeline * layout.data == 64
        assert 16 % layout.tensor == 0 and 24 % layout.pipeline == 0
        assert 512 % (layout.data * layout.micro_batch) == 0


def test_single_gpu_memory_is_state_activations_and_logits():
    """FlashAttention-size activations (no s^2 scores) and float32 logits, on one GPU."""
    layout = Layout(1, 1, 1, 0, 1, False)
    parts = memory_per_gpu(ONE_B, layout, 1)
    assert math.isclose(parts["state"], 16 * ONE_B.num_params)
    per_layer = memory.activation_bytes_per_layer(2048, 1, 2048, 16, recompute="selective")
    assert math.isclose(parts["activations"], 24 * per_layer)
    assert math.isclose(parts["logits"], 4 * 2048 * 50304)


def test_single_gpu_time_is_compute_only():
    one = ClusterSpec(1, 8, H100_MEMORY_BYTES, 450 * GB, gbit_per_s(400), 400e12)
    parts = step_time_breakdown(ONE_B, one, Layout(1, 1, 1, 0, 1, False), 8)
    assert parts["bubble"] == parts["tensor"] == parts["pipeline"] == parts["data"] == 0


def test_plan_is_sorted_and_fits():
    ranked = plan(ONE_B, CLUSTER, 512)
    times = [round(seconds, 9) for _, _, seconds in ranked]  # equal to the nanosecond: a tie
    assert times == sorted(times)
    assert all(peak <= USABLE_FRACTION * CLUSTER.memory_bytes for _, peak, _ in ranked)
    # The lesson's choice for a 1B model on 64 GPUs: sharded data parallelism only. With
    # micro-batches of 4 (2 per step) everything hides; ZeRO-2 ties on time but re-sends the
    # gradients per micro-batch, so ZeRO-1 (which already shards the optimizer state) wins.
    best = ranked[0][0]
    assert (best.tensor, best.pipeline, best.data, best.zero_stage) == (1, 1, 64, 1)


def test_only_the_last_micro_batch_hides_the_all_reduce():
    """Plain DP, micro-batch 1: 8 micro-batches, 2/3 of one of them hides the all-reduce."""
    plain = Layout(1, 1, 64, 0, 1, False)
    parts = step_time_breakdown(ONE_B, CLUSTER, plain, 512)
    allreduce = 2 * 63 / 64 * 2 * ONE_B.num_params / gbit_per_s(400)  # ~0.104 s
    assert parts["data"] == pytest.approx(allreduce - 2 / 3 * parts["compute"] / 8)
    assert parts["data"] == pytest.approx(0.07, abs=0.005)
    # the same batch in one micro-batch per GPU would hide it whole
    assert data_parallel_seconds(ONE_B, CLUSTER, plain, 64, parts["compute"]) == 0


def test_zero2_loses_to_zero1_with_many_micro_batches():
    times = {
        stage: sum(
            step_time_breakdown(ONE_B, CLUSTER, Layout(1, 1, 64, stage, 1, False), 512).values()
        )
        for stage in (1, 2)
    }
    assert times[2] > times[1] + 0.1  # 8 reduce-scatters instead of 1


def test_zero3_regathers_the_weights_for_every_micro_batch():
    """GPT-3 on tensor 8 x FSDP 8: ~0.9 TB per GPU per step, ~18 s at 400 Gb/s."""
    layout = Layout(8, 1, 8, 3, 1, False)
    parts = step_time_breakdown(GPT3, CLUSTER, layout, 64)
    traffic_s = 3 * 8 * 7 / 8 * 2 * GPT3.num_params / 8 / gbit_per_s(400)
    assert traffic_s == pytest.approx(18.3, abs=0.2)
    assert parts["data"] > 0.6 * traffic_s  # one micro-batch's compute hides little of it
    ranked = plan(GPT3, CLUSTER, 64)
    best = ranked[0][0]
    assert best.zero_stage < 3 and best.tensor == 8 and best.pipeline > 1  # ZeRO-3 does not win


def test_no_zero_2_or_3_with_a_pipeline():
    found = list(layouts(GPT3, CLUSTER, 64))
    assert {lay.zero_stage for lay in found if lay.pipeline == 1} == {0, 1, 2, 3}
    assert {lay.zero_stage for lay in found if lay.pipeline > 1} == {0, 1}


def test_gpt3_needs_model_parallelism():
    ranked = plan(GPT3, CLUSTER, 64, zero_stages=(0, 1))
    assert all(layout.tensor * layout.pipeline > 1 for layout, _, _ in ranked)
    best = ranked[0][0]
    assert best.tensor > 1 and best.pipeline > 1


def test_unknown_zero_stage_raises():
    with pytest.raises(ValueError, match="zero_stage"):
        plan(ONE_B, CLUSTER, 512, zero_stages=(5,))


def test_tensor_in_server_keeps_tensor_groups_inside_a_server():
    four = ClusterSpec(64, 4, H100_MEMORY_BYTES, 450 * GB, gbit_per_s(400), 400e12)
    kept = list(layouts(GPT3, four, 64, tensor_in_server=True))
    assert kept and all(4 % layout.tensor == 0 for layout in kept)
    every = list(layouts(GPT3, four, 64))
    assert set(kept) == {layout for layout in every if 4 % layout.tensor == 0}
    ranked = plan(GPT3, four, 64, zero_stages=(0, 1), tensor_in_server=True)
    assert [row[0] for row in ranked] == [
        row[0] for row in plan(GPT3, four, 64, zero_stages=(0, 1)) if 4 % row[0].tensor == 0
    ]


# --- traffic first, in bytes ------------------------------------------------------------------


def test_tensor_and_pipeline_bytes_by_hand():
    """t 4 x p 2 x d 8, micro-batch 2: 4 all-reduces (6 recomputing) of b s h 16-bit values
    per layer and micro-batch, 2(t-1)/t of each; an activation and a gradient per micro-batch."""
    for recompute, per_layer in ((False, 4), (True, 6)):
        layout = Layout(4, 2, 8, 1, 2, recompute)
        m = layout.micro_batches(512)
        sent = traffic_bytes(ONE_B, layout, 512)
        message = 2 * 2048 * 2048 * 2
        assert sent["tensor"] == pytest.approx(per_layer * 12 * m * 2 * 3 / 4 * message)
        assert sent["pipeline"] == pytest.approx(2 * m * message)
        assert sent["context"] == sent["expert"] == 0
        assert sent["data"] == comm.sharded_step_bytes_sent(
            ONE_B.num_params / 8, zero_stage=1, world_size=8, micro_batches=m
        )


def test_context_bytes_are_ring_attention_hops():
    """c - 1 hops of 2 (s/c) h values per layer, forward; the backward twice that."""
    layout = Layout(1, 1, 16, 1, 1, False, context=4)
    sent = traffic_bytes(ONE_B, layout, 64)
    m = layout.micro_batches(64)
    forward = 24 * m * 3 * 2 * (2048 // 4) * 2048 * 2
    assert sent["context"] == pytest.approx(3 * forward)
    # tensor ranks split the heads; grouped-query attention sends kv_heads / heads of it
    gqa = ModelSpec(24, 2048, 16, 50304, 2048, kv_heads=4)
    split = Layout(2, 1, 8, 1, 1, False, context=4)
    assert traffic_bytes(gqa, split, 64)["context"] == pytest.approx(
        traffic_bytes(ONE_B, split, 64)["context"] * 4 / 16
    )
    # t = 2 halves each rank's K/V; d = 8 instead of 16 doubles the micro-batches
    assert traffic_bytes(ONE_B, split, 64)["context"] == pytest.approx(sent["context"] / 2 * 2)


def test_expert_bytes_are_four_all_to_alls_of_the_off_diagonal_copies():
    moe = ModelSpec(24, 2048, 16, 50304, 2048, experts=8, top_k=2)
    layout = Layout(1, 1, 16, 1, 1, False, expert=4)
    m = layout.micro_batches(64)
    copies = 2 * 2048 * 3 / 4  # top-2 copies of 2048 tokens, 3/4 to the other 3 devices
    assert traffic_bytes(moe, layout, 64)["expert"] == pytest.approx(4 * 24 * m * copies * 2048 * 2)
    assert traffic_bytes(ONE_B, layout, 64)["expert"] == 0  # a dense model has no all-to-all


def test_seconds_are_the_bytes_over_each_groups_link():
    layout = Layout(8, 2, 2, 1, 1, False, context=2)  # tensor in a server, context across two
    sent = traffic_bytes(ONE_B, layout, 64)
    parts = step_time_breakdown(ONE_B, CLUSTER, layout, 64)
    spans = group_spans(layout)
    assert spans == {"tensor": 8, "context": 16, "pipeline": 32, "expert": 32, "data": 64}
    assert parts["tensor"] == pytest.approx(sent["tensor"] / (450 * GB))
    assert parts["context"] == pytest.approx(sent["context"] / gbit_per_s(400))
    assert parts["pipeline"] == pytest.approx(sent["pipeline"] / gbit_per_s(400))


def test_context_parallelism_splits_the_activations_and_shards_over_d_c():
    one = memory_per_gpu(ONE_B, Layout(1, 1, 16, 1, 1, False), 64)
    four = memory_per_gpu(ONE_B, Layout(1, 1, 16, 1, 1, False, context=4), 64)
    assert four["activations"] == pytest.approx(one["activations"] / 4)
    assert four["logits"] == pytest.approx(one["logits"] / 4)
    assert four["state"] < one["state"]  # the optimizer state sharded over 64, not 16


# --- one answer: the tie-break, no duplicates, headroom, MFU ---------------------------------


def test_ties_go_to_less_traffic_then_less_memory():
    ranked = plan(ONE_B, CLUSTER, 512)
    tied = [row for row in ranked if round(row[2], 9) == round(ranked[0][2], 9)]
    assert len(tied) > 4  # ZeRO 0-3 at micro-batch 4 and 8 all take 0.372 s
    keys = [rank_key(s, sum(traffic_bytes(ONE_B, lay, 512).values()), p) for lay, p, s in tied]
    assert keys == sorted(keys)
    best = ranked[0][0]
    assert (best.zero_stage, best.micro_batch) == (1, 4)


def test_no_layout_is_listed_twice_under_two_names():
    """ZeRO-1 over one replica is ZeRO-0: only stage 0 is listed when d c = 1."""
    found = list(layouts(GPT3, CLUSTER, 64))
    assert all(lay.zero_stage == 0 for lay in found if lay.data * lay.context == 1)
    rows = [
        (round(p), round(s, 9), sum(traffic_bytes(GPT3, lay, 64).values()))
        for lay, p, s in plan(GPT3, CLUSTER, 64)
    ]
    assert len(rows) == len(set(rows))


def test_headroom_keeps_the_last_tenth_of_memory_free():
    strict = plan(GPT3, CLUSTER, 64, zero_stages=(0, 1))
    loose = plan(GPT3, CLUSTER, 64, zero_stages=(0, 1), usable_fraction=1.0)
    assert len(loose) > len(strict)
    assert {row[0] for row in strict} < {row[0] for row in loose}
    with pytest.raises(ValueError, match="usable_fraction"):
        plan(GPT3, CLUSTER, 64, usable_fraction=0)


def test_mfu_is_capped_by_the_sustained_rate():
    layout, _, seconds = plan(ONE_B, CLUSTER, 512)[0]
    flops = transformer.training_flops(512, 2048, 24, 2048, 50304)
    assert mfu(ONE_B, CLUSTER, 512, seconds) == pytest.approx(flops / (seconds * 64 * 989e12))
    assert mfu(ONE_B, CLUSTER, 512, seconds) == pytest.approx(400 / 989)  # all compute
    for _, _, seconds in plan(GPT3, CLUSTER, 64)[:10]:
        assert mfu(GPT3, CLUSTER, 64, seconds) < 400 / 989


def test_4d_long_sequences_prefer_context_to_recomputation():
    """Llama-3 8B on 131,072-token sequences: 3D must recompute, 4D splits the sequence."""
    long = dataclasses.replace(shape.PRESETS["llama3-8b"][1], seq_len=131_072)
    three = plan(long, CLUSTER, 16)[0]
    four = plan(long, CLUSTER, 16, context_degrees=(1, 2, 4, 8, 16))[0]
    assert three[0].recompute == "full" and three[0].context == 1
    assert four[0].context > 1 and four[0].recompute == "none" and four[2] < 0.9 * three[2]
    # grouped-query attention: 8 of 32 heads' keys and values travel the ring
    sent = traffic_bytes(long, four[0], 16)["context"]
    dense = traffic_bytes(dataclasses.replace(long, kv_heads=None), four[0], 16)["context"]
    assert sent == pytest.approx(dense / 4)


def test_training_flops_are_narayanans_for_a_gpt_shape():
    for model in (ONE_B, GPT3):
        for recompute in (False, True):
            got = training_flops(model, 64, recompute=recompute)
            want = transformer.training_flops(
                64, 2048, model.layers, model.hidden, model.vocab, recompute=recompute
            )
            assert got == pytest.approx(want, rel=1e-12)


def test_a_mixtures_experts_reduce_their_gradients_over_d_c_over_e():
    """The experts' gradients travel among the d c / e GPUs that hold the same experts."""
    moe = ModelSpec(24, 2048, 16, 50304, 2048, experts=8, top_k=2)
    layout = Layout(1, 1, 16, 0, 1, "none", expert=4)
    dense = moe.num_params - moe.expert_params
    expected = comm.ring_allreduce_bytes_sent(2 * dense, 16) + comm.ring_allreduce_bytes_sent(
        2 * moe.expert_params / 4, 4
    )
    assert traffic_bytes(moe, layout, 64)["data"] == pytest.approx(expected)


# --- the expert axis searched (expert_degrees=) ------------------------------------------------

MOE = ModelSpec(24, 2048, 16, 50304, 2048, experts=8, top_k=2)


def _fields(layout):
    return tuple(vars(layout).values())


def test_expert_degrees_default_is_the_e_1_slice_of_the_search():
    """By default e = 1, and searching more degrees leaves the e = 1 layouts as they were."""
    wide = list(layouts(MOE, CLUSTER, 64, expert_degrees=(1, 2, 4, 8)))
    assert list(layouts(MOE, CLUSTER, 64)) == [lay for lay in wide if lay.expert == 1]
    assert plan(ONE_B, CLUSTER, 512) == plan(ONE_B, CLUSTER, 512, expert_degrees=(1,))
    assert {lay.expert for lay in wide} == {1, 2, 4, 8}


def test_expert_degrees_are_taken_only_where_they_divide_d():
    """e | d (e consecutive data-parallel replicas hold the experts), for every other field."""
    degrees = (1, 2, 4, 8)
    found = list(layouts(MOE, CLUSTER, 64, expert_degrees=degrees, context_degrees=(1, 4)))
    by_rest = {}
    for lay in found:
        assert lay.data % lay.expert == 0 and MOE.experts % lay.expert == 0
        by_rest.setdefault(_fields(dataclasses.replace(lay, expert=1)), set()).add(lay.expert)
    assert any(d.data < 8 for d in found)  # some d leave out the larger degrees
    for rest, taken in by_rest.items():
        data = Layout(*rest).data
        assert taken == {e for e in degrees if data % e == 0}, (rest, taken)


def test_expert_degrees_that_no_layout_could_take_are_refused():
    with pytest.raises(ValueError, match="dense"):
        plan(ONE_B, CLUSTER, 64, expert_degrees=(1, 2))
    with pytest.raises(ValueError, match="divide the model's 8 experts"):
        plan(MOE, CLUSTER, 64, expert_degrees=(1, 3))
    with pytest.raises(ValueError, match="stated parameter count"):
        plan(dataclasses.replace(MOE, params=3e9), CLUSTER, 64, expert_degrees=(1, 2))
    for bad in ((0,), (1.5,), ()):
        with pytest.raises(ValueError, match="expert"):
            list(layouts(MOE, CLUSTER, 64, expert_degrees=bad))


def test_a_searched_moe_layouts_all_to_alls_by_hand():
    """t 2 x c 2 x d 16 with e 2, micro-batch 2, full recomputation: per layer and micro-batch
    6 all-to-alls (4 + the recomputed forward's 2), each the top-2 copies of the GPU's
    b (s/c) / t tokens that go to the other device, 1/2 of them, h 16-bit values each; over
    NVLink while t c p e = 8 GPUs, over InfiniBand at e = 4 (16 GPUs)."""
    layout = Layout(2, 1, 16, 1, 2, "full", context=2, expert=2)
    assert layout in set(layouts(MOE, CLUSTER, 64, context_degrees=(2,), expert_degrees=(2,)))
    m = 64 // (16 * 2)
    tokens = 2 * (2048 // 2) // 2
    assert traffic_bytes(MOE, layout, 64)["expert"] == 24 * m * 6 * (2 * tokens * 1 / 2) * 2048 * 2
    wide = dataclasses.replace(layout, expert=4)
    for lay, link in ((layout, 450 * GB), (wide, gbit_per_s(400))):
        assert group_spans(lay)["expert"] == 2 * 2 * lay.expert
        sent = traffic_bytes(MOE, lay, 64)["expert"]
        assert step_time_breakdown(MOE, CLUSTER, lay, 64)["expert"] == pytest.approx(sent / link)


def test_sharding_the_experts_frees_what_the_formula_says():
    """Weights and gradients (2 + 2 bytes) of the experts fall to 1/e; ZeRO-1's optimizer state
    is sharded over d c GPUs either way (the experts' over d c / e, of 1/e of them)."""
    for t, d in ((1, 64), (4, 16)):
        base = memory_per_gpu(MOE, Layout(t, 1, d, 1, 1, "none"), 64)
        for e in (2, 4, 8):
            held = memory_per_gpu(MOE, Layout(t, 1, d, 1, 1, "none", expert=e), 64)
            saved = 4 * MOE.expert_params / t * (1 - 1 / e)
            assert base["state"] - held["state"] == pytest.approx(saved, rel=1e-12)
            assert held["activations"] == base["activations"]


def test_the_planner_shards_the_experts_when_memory_forces_it():
    """One layer and one head (t = p = 1 only) on 8 GPUs whose memory lies between what e = 2
    and e = 4 need: nothing fits without the expert axis, and with it only e >= 4."""
    moe = ModelSpec(1, 1024, 1, 1000, 256, experts=8, top_k=2)
    need = {
        e: sum(memory_per_gpu(moe, Layout(1, 1, 8, 0, 1, "none", expert=e), 8).values())
        for e in (2, 4)
    }
    small = ClusterSpec(8, 8, (need[2] + need[4]) / 2, 450 * GB, gbit_per_s(400), 400e12)
    kwargs = dict(zero_stages=(0,), usable_fraction=1.0)
    assert plan(moe, small, 8, **kwargs) == []
    ranked = plan(moe, small, 8, expert_degrees=(1, 2, 4, 8), **kwargs)
    assert ranked and all(lay.expert >= 4 for lay, _, _ in ranked)
    assert Layout(1, 1, 8, 0, 1, "none", expert=4) in {lay for lay, _, _ in ranked}
