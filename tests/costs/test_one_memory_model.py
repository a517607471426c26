"""The planner, 02's peak memory and the memory explorer give the same bytes for the same model
and layout: all three are distopt.costs.memory.gpu_memory (issue 40, one memory model)."""

import pytest

from distopt.costs import memory, planner
from distopt.costs.shape import Layout, TransformerShape
from distopt.explore import memory as explore

LAYERS, HIDDEN, HEADS, VOCAB, SEQ = 24, 2048, 16, 50_304, 2048  # 03's 1.3B model


def _explorer_bytes(tensor, pipeline, gpus, zero_stage, micro_batch, micro_batches, recompute):
    settings = dict(
        explore.DEFAULTS,
        model="custom",
        layers=LAYERS,
        hidden=HIDDEN,
        heads=HEADS,
        kv_heads=HEADS,
        mlp="gelu",
        ffn_hidden=4 * HIDDEN,
        vocab=VOCAB,
        seq_len=SEQ,
        gpus=gpus,
        tensor=tensor,
        pipeline=pipeline,
        zero_stage=zero_stage,
        micro_batch=micro_batch,
        micro_batches=micro_batches,
        recompute=recompute,
        sequence_parallel=True,
        flash_attention=True,
    )
    _, model, _ = explore.model_of(settings)
    layout = explore.layout_of(settings, zero_stage)
    _, parts = explore.busiest_gpu(settings, model, layout, explore._state, explore._layer)
    return sum(parts.values())


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_planner_02_peak_and_explorer_agree_on_one_gpu_layouts(zero_stage, recompute):
    model = planner.ModelSpec(LAYERS, HIDDEN, HEADS, VOCAB, SEQ)
    layout = planner.Layout(1, 1, 8, zero_stage, 2, recompute == "full")
    planned = sum(planner.memory_per_gpu(model, layout, global_batch=16).values())
    peak_02 = memory.peak_training_bytes(
        model.num_params,
        LAYERS,
        SEQ,
        2,
        HIDDEN,
        HEADS,
        zero_stage=zero_stage,
        world_size=8,
        recompute=recompute,
        vocab=VOCAB,
        flash_attention=True,
    )
    shared = memory.gpu_memory(
        TransformerShape(LAYERS, HIDDEN, HEADS, VOCAB, SEQ),
        Layout(data=8, zero_stage=zero_stage, micro_batch=2, recompute=recompute),
    )
    explored = _explorer_bytes(1, 1, 8, zero_stage, 2, 1, recompute)
    assert planned == pytest.approx(sum(shared.values()), rel=1e-12)
    assert peak_02 == pytest.approx(planned, rel=1e-12)
    assert explored == pytest.approx(planned, rel=1e-12)


@pytest.mark.parametrize(
    ("tensor", "pipeline", "data", "zero_stage", "recompute"),
    [(2, 4, 2, 1, "none"), (4, 2, 2, 0, "full"), (2, 1, 8, 3, "none"), (8, 3, 1, 0, "full")],
)
def test_planner_and_explorer_agree_under_tensor_and_pipeline_parallelism(
    tensor, pipeline, data, zero_stage, recompute
):
    model = planner.ModelSpec(LAYERS, HIDDEN, HEADS, VOCAB, SEQ)
    layout = planner.Layout(tensor, pipeline, data, zero_stage, 1, recompute == "full")
    micro_batches = 8
    planned = sum(planner.memory_per_gpu(model, layout, data * micro_batches).values())
    gpus = tensor * pipeline * data
    explored = _explorer_bytes(tensor, pipeline, gpus, zero_stage, 1, micro_batches, recompute)
    shared = memory.gpu_memory(
        TransformerShape(LAYERS, HIDDEN, HEADS, VOCAB, SEQ),
        Layout(tensor, pipeline, data, zero_stage, 1, recompute),
        micro_batches=micro_batches,
    )
    assert planned == pytest.approx(sum(shared.values()), rel=1e-12)
    assert explored == pytest.approx(planned, rel=1e-12)


def test_02_exercise_5_is_the_naive_attention_case_of_the_same_model():
    """02's peak_bytes_per_gpu (naive attention, its default) is gpu_memory without
    FlashAttention; the explorer's check line compares the two."""
    for recompute in ("none", "selective", "full"):
        peak_02 = memory.peak_training_bytes(
            7e9, 32, 4096, 1, 4096, 32, zero_stage=3, world_size=8, recompute=recompute
        )
        shared = memory.gpu_memory(
            TransformerShape(32, 4096, 32, 32_000, 4096, params=7e9),
            Layout(data=8, zero_stage=3, recompute=recompute, flash_attention=False),
        )
        assert peak_02 == pytest.approx(sum(shared.values()), rel=1e-12)
