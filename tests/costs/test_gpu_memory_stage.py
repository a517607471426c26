"""One GPU's memory in a tensor x pipeline x data layout: memory.gpu_memory_stage, the
course's one memory model, against section 02's peak breakdown, by hand, and the planner."""

import pytest

from distopt.costs import memory, planner
from distopt.costs.shape import Layout, TransformerShape


def _breakdown(num_params, num_layers, seq_len, micro_batch, hidden, heads, *, zero_stage,
               data_parallel, tensor_parallel=1, pipeline_parallel=1, sequence_parallel=False,
               recompute="none", micro_batches=1, stage=0, vocab=32_000,
               flash_attention=False):  # fmt: skip
    """gpu_memory_stage of a GPT-style shape given by 02's six numbers."""
    model = TransformerShape(num_layers, hidden, heads, vocab, seq_len, params=num_params)
    layout = Layout(
        tensor=tensor_parallel,
        pipeline=pipeline_parallel,
        data=data_parallel,
        zero_stage=zero_stage,
        micro_batch=micro_batch,
        recompute=recompute,
        flash_attention=flash_attention,
        sequence_parallel=sequence_parallel,
    )
    return memory.gpu_memory_stage(model, layout, micro_batches=micro_batches, stage=stage)


def test_stage_activations_count_the_micro_batches_in_flight_under_1f1b():
    # 8 layers on 4 stages, 6 micro-batches: stage 0 holds 4 in flight, stage 3 one.
    kw = dict(num_layers=8, pipeline_parallel=4, micro_batches=6)
    assert memory.stage_activation_bytes(10, 100, stage=0, **kw) == (4 * 2 - 1) * 10 + 100
    assert memory.stage_activation_bytes(10, 100, stage=3, **kw) == (1 * 2 - 1) * 10 + 100
    # fewer micro-batches than stages: all of them are in flight on the first stage
    few = dict(kw, micro_batches=2)
    assert memory.stage_activation_bytes(10, 100, stage=0, **few) == 3 * 10 + 100
    assert memory.stage_activation_bytes(10, 100, num_layers=5) == 4 * 10 + 100
    for bad in (dict(kw, pipeline_parallel=3), dict(kw, stage=4), dict(kw, micro_batches=0)):
        with pytest.raises(ValueError):
            memory.stage_activation_bytes(10, 100, **bad)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_parallel_breakdown_without_model_parallelism_is_the_peak_breakdown(stage, recompute):
    shape = (7e9, 32, 4096, 2, 4096, 32)
    got = _breakdown(
        *shape, zero_stage=stage, data_parallel=8, recompute=recompute, micro_batches=4,
        vocab=128_256,
    )  # fmt: skip
    peak = memory.peak_training_breakdown(
        *shape, zero_stage=stage, world_size=8, recompute=recompute, vocab=128_256
    )
    assert set(got) == {"weights", "gradients", "optimizer", "activations", "logits", "gathered"}
    state = got["weights"] + got["gradients"] + got["optimizer"]
    assert state == pytest.approx(peak["state"], rel=1e-12)
    for part in ("activations", "logits", "gathered"):
        assert got[part] == pytest.approx(peak[part], rel=1e-12), part


def test_parallel_breakdown_by_hand_on_a_tensor_and_pipeline_layout():
    # 70e9 parameters, 80 layers, t = 8, p = 4, d = 2, ZeRO-1, sequence parallel, selective,
    # 8 micro-batches of 1 x 4096 tokens, hidden 8192, 64 heads, vocab 32,000.
    n, t, p, d = 70e9, 8, 4, 2
    kw = dict(zero_stage=1, data_parallel=d, tensor_parallel=t, pipeline_parallel=p,
              sequence_parallel=True, recompute="selective", micro_batches=8)  # fmt: skip
    sbh = 4096 * 8192
    stored, working = sbh * 34 / t, sbh * (34 / t + 5 * 64 * 4096 / (8192 * t))
    first = _breakdown(n, 80, 4096, 1, 8192, 64, stage=0, **kw)
    last = _breakdown(n, 80, 4096, 1, 8192, 64, stage=3, **kw)
    share = n / (t * p)
    for parts in (first, last):
        assert parts["weights"] == pytest.approx(2 * share)
        assert parts["gradients"] == pytest.approx(2 * share)
        assert parts["optimizer"] == pytest.approx(12 * share / d)
        assert parts["gathered"] == 0
    assert first["activations"] == pytest.approx((4 * 20 - 1) * stored + working)
    assert last["activations"] == pytest.approx((1 * 20 - 1) * stored + working)
    assert first["logits"] == 0
    assert last["logits"] == pytest.approx(4 * 4096 * 32_000 / t)
    zero3 = _breakdown(n, 80, 4096, 1, 8192, 64, zero_stage=3, data_parallel=4, tensor_parallel=4)
    assert zero3["gathered"] == pytest.approx(12 * 8192**2 / 4 * 4)
    assert zero3["weights"] == pytest.approx(2 * n / 4 / 4)
    with pytest.raises(ValueError, match="divide heads"):
        _breakdown(n, 80, 4096, 1, 8192, 64, zero_stage=0,
                                           data_parallel=1, tensor_parallel=3)  # fmt: skip


@pytest.mark.parametrize("recompute", [False, True])
def test_parallel_breakdown_agrees_with_the_planner(recompute):

    model = planner.ModelSpec(layers=48, hidden=6144, heads=48, vocab=50_000, seq_len=2048)
    layout = planner.Layout(tensor=4, pipeline=4, data=8, zero_stage=1, micro_batch=2,
                            recompute=recompute)  # fmt: skip
    planned = planner.memory_per_gpu(model, layout, global_batch=8 * 2 * 16)
    got = _breakdown(
        model.num_params, 48, 2048, 2, 6144, 48, zero_stage=1, data_parallel=8,
        tensor_parallel=4, pipeline_parallel=4, sequence_parallel=True,
        recompute="full" if recompute else "none", micro_batches=16, flash_attention=True,
    )  # fmt: skip
    state = got["weights"] + got["gradients"] + got["optimizer"]
    assert state == pytest.approx(planned["state"], rel=1e-12)
    assert got["gathered"] == planned["gathered"] == 0
    # Both are section 02's model with FlashAttention: the same activations to the byte.
    assert got["activations"] == pytest.approx(planned["activations"], rel=1e-12)
