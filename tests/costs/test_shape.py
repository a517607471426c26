"""One shape and one layout for the cost models (distopt.costs.shape), the memory model on them."""

import pytest

from distopt.costs import memory, transformer
from distopt.costs.shape import PRESETS, Layout, TransformerShape, param_count
from distopt.units import GB, GIB, H100_MEMORY_BYTES


def test_gpt_style_shape_counts_narayanan_equation_2():
    for layers, hidden, heads, vocab, seq in [(96, 12288, 96, 51200, 2048), (3, 64, 4, 100, 32)]:
        shape = TransformerShape(layers, hidden, heads, vocab, seq)
        assert shape.num_params == pytest.approx(
            transformer.param_count(layers, hidden, vocab, seq), rel=1e-12
        )
        assert shape.layer_params == 12 * hidden**2


@pytest.mark.parametrize(
    ("key", "published"),
    [("llama3-8b", 8_030_261_248), ("llama3-70b", 70.55e9), ("llama3-405b", 405.85e9)],
)
def test_llama3_presets_count_the_published_models(key, published):
    _, shape = PRESETS[key]
    assert shape.mlp == "swiglu" and shape.kv_heads == 8 and not shape.tied_embeddings
    assert shape.num_params == pytest.approx(published, rel=2e-4)
    # a GPT-style model of the same shape is the count the issue found wrong (about 7.0B...)
    gpt = TransformerShape(shape.layers, shape.hidden, shape.heads, shape.vocab, shape.seq_len)
    assert abs(gpt.num_params - published) / published > 0.005


def test_llama3_8b_exact_count():
    """Every tensor of the checkpoint: 32 x (attention 41.9M + MLP 176.2M + 2 norms) + 2 V h + h."""
    _, shape = PRESETS["llama3-8b"]
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert param_count(shape) == 32 * per_layer + 2 * 128256 * 4096 + 4096 == 8_030_261_248


def test_stated_count_and_validation():
    assert TransformerShape(80, 8192, 64, 32000, 4096, params=70e9).num_params == 70e9
    for bad in (dict(kv_heads=3), dict(mlp="relu"), dict(experts=2, top_k=3)):
        with pytest.raises(ValueError):
            TransformerShape(2, 64, 4, 10, 8, **bad)
    with pytest.raises(ValueError):
        TransformerShape(2, 65, 4, 10, 8)


def test_layout_reads_booleans_and_checks():
    assert Layout(1, 1, 8, 1, 1, True).recompute == "full"
    assert Layout(1, 1, 8, 1, 1, False).recompute == "none"
    assert Layout(2, 3, 4, context=5).gpus == 120
    assert Layout(data=8, micro_batch=2).micro_batches(64) == 4
    for bad in (dict(recompute="some"), dict(zero_stage=4), dict(tensor=0)):
        with pytest.raises(ValueError):
            Layout(**bad)


def test_flash_attention_drops_the_recomputed_layers_scores():
    """02's 7B layer at 4,096 tokens: the layer being processed holds its s^2 scores only with
    naive attention (3.25 GB), not with FlashAttention (0.57 GB = 34 sbh)."""
    shape = TransformerShape(32, 4096, 32, 32_000, 4096)
    sbh = 4096 * 4096
    for mode in ("none", "selective", "full"):
        naive = memory.layer_activation_bytes(
            shape, Layout(recompute=mode, flash_attention=False), working=True
        )
        flash = memory.layer_activation_bytes(shape, Layout(recompute=mode), working=True)
        assert naive == 194 * sbh and round(naive / GB, 2) == 3.25
        assert flash == 34 * sbh and round(flash / GB, 2) == 0.57
    # stored: selective (or FlashAttention) 34 sbh, naive 194 sbh, full 2 sbh
    assert memory.layer_activation_bytes(shape, Layout()) == 34 * sbh
    assert memory.layer_activation_bytes(shape, Layout(flash_attention=False)) == 194 * sbh
    assert memory.layer_activation_bytes(shape, Layout(recompute="full")) == 2 * sbh


def test_gqa_and_swiglu_activations():
    """Llama 3 8B: K and V of 8 of 32 heads (r = 1/4), SwiGLU of width 14336: per layer
    sbh (10 + 4 + 4 r + 6 f / h) = sbh (15 + 6 x 3.5) = 36 sbh with FlashAttention."""
    _, shape = PRESETS["llama3-8b"]
    sbh = 8192 * 4096
    assert memory.layer_activation_bytes(shape, Layout()) == pytest.approx(36 * sbh, rel=1e-12)
    # tensor 4 with sequence parallelism splits everything over 4
    split = memory.layer_activation_bytes(shape, Layout(tensor=4))
    assert split == pytest.approx(9 * sbh, rel=1e-12)


def test_old_functions_are_the_one_model():
    """02's six-argument functions call the same model as the layout's."""
    for recompute in ("none", "selective", "full"):
        for stage in (0, 3):
            old = memory.peak_training_breakdown(
                7e9, 32, 4096, 1, 4096, 32, zero_stage=stage, world_size=8, recompute=recompute
            )
            new = memory.gpu_memory(
                TransformerShape(32, 4096, 32, 32_000, 4096, params=7e9),
                Layout(data=8, zero_stage=stage, recompute=recompute, flash_attention=False),
            )
            assert sum(old.values()) == pytest.approx(sum(new.values()), rel=1e-12)


def test_context_and_experts_memory():
    shape = TransformerShape(4, 256, 8, 1000, 1024, experts=8, top_k=2)
    one = memory.gpu_memory(shape, Layout(data=8))
    split = memory.gpu_memory(shape, Layout(data=8, expert=8))
    # 8-way expert parallelism keeps 1/8 of the experts' state, the rest unchanged
    dense = shape.num_params - shape.expert_params
    assert one["weights"] == pytest.approx(2 * shape.num_params)
    assert split["weights"] == pytest.approx(2 * (dense + shape.expert_params / 8))
    context = memory.gpu_memory(shape, Layout(data=2, context=4, zero_stage=1))
    plain = memory.gpu_memory(shape, Layout(data=8, zero_stage=1))
    # context-parallel GPUs hold the same weights: ZeRO shards over d c = 8 alike
    assert context["optimizer"] == pytest.approx(plain["optimizer"])
    assert context["activations"] == pytest.approx(plain["activations"] / 4)
    assert context["logits"] == pytest.approx(plain["logits"] / 4)


def test_h100_is_one_constant():
    assert H100_MEMORY_BYTES == 80 * GIB
    # 13B under ZeRO-1: 52 GB replicated, 156 GB sharded: 5 GPUs of 80 GiB (6 of 80e9 bytes)
    fits = [
        n
        for n in range(1, 10)
        if memory.training_state_bytes(13e9, zero_stage=1, world_size=n) <= H100_MEMORY_BYTES
    ]
    assert fits[0] == 5


def test_07s_gpt_config_reads_as_a_shape():
    """07's torch GPT, counted by the shape: every parameter but the final LayerNorm's 2h
    (the head has no bias, so the untied output layer is V h)."""
    from distopt.costs.shape import from_gpt_config
    from distopt.project.gpt import GPT, GPTConfig

    for config in (
        GPTConfig(),
        GPTConfig(vocab_size=50, seq_len=16, n_layer=3, n_head=2, d_model=24, mlp_ratio=3),
    ):
        model = GPT(config)
        counted = sum(p.numel() for p in model.parameters())
        shape = from_gpt_config(config)
        assert shape.num_params == counted - 2 * config.d_model


def test_mixtral_preset_counts_the_published_model():
    """Mixtral 8x7B: 32 x (attention 41.9M + 8 SwiGLU experts of 176.2M + router 4096 x 8 + 2
    norms) + 2 V h + h = 46.70B (the checkpoint's 46,702,792,704); top-2 of 8 experts active:
    12.88B (Jiang et al. 2024: 47B and 13B)."""
    _, shape = PRESETS["mixtral-8x7b"]
    expert = 3 * 4096 * 14336
    attention = 2 * 4096**2 + 2 * 4096 * 1024
    per_layer = attention + 8 * expert + 4096 * 8 + 2 * 4096
    assert param_count(shape) == 32 * per_layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert shape.expert_params == 32 * 8 * expert
    assert shape.active_params == pytest.approx(shape.num_params - 32 * 6 * expert, rel=1e-15)
    assert round(shape.active_params / 1e9, 1) == 12.9
    dense = TransformerShape(32, 4096, 32, 32000, 4096)
    assert dense.active_params == dense.num_params
