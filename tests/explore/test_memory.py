"""Section 02's memory explorer: its numbers are the package's models, its controls redraw."""

from dataclasses import replace

import pytest
from matplotlib.figure import Figure

from distopt.costs import comm, memory
from distopt.costs.shape import PRESETS, Layout, TransformerShape
from distopt.explore import memory as explore
from distopt.units import GB, GIB

TOL = 5.01e-4  # the readout prints GB to 3 decimals


def _value(lines, prefix):
    """The number after ``prefix`` on the line that starts with it (GB)."""
    (line,) = [x for x in lines if x.strip().startswith(prefix)]
    return float(line.strip()[len(prefix) :].split()[0].rstrip(":").replace(",", ""))


def test_the_lessons_70b_with_zero3_on_64_gpus_by_hand():
    v = explore.view(explore.DEFAULTS)
    assert isinstance(v.figure, Figure)
    lines = v.lines
    # 16 bytes per parameter over 64 GPUs: 2 + 2 + 12 bytes x 70e9 / 64 (the lesson's 17.5 GB)
    assert _value(lines, "weights") == pytest.approx(2 * 70e9 / 64 / GB, abs=TOL)
    assert _value(lines, "optimizer") == pytest.approx(12 * 70e9 / 64 / GB, abs=TOL)
    # 80 layers of 4096 x 8192, FlashAttention: 34 sbh each, the working layer too (no scores)
    sbh = 4096 * 8192
    assert _value(lines, "activations") == pytest.approx(80 * 34 * sbh / GB, abs=TOL)
    assert _value(lines, "logits") == pytest.approx(4 * 4096 * 32_000 / GB, abs=TOL)
    assert _value(lines, "gathered layer") == pytest.approx(12 * 8192**2 * 4 / GB, abs=TOL)
    total = 16 * 70e9 / 64 + 80 * 34 * sbh + 4 * 4096 * 32_000 + 12 * 8192**2 * 4
    assert _value(lines, "total ") == pytest.approx(total / GB, abs=TOL)
    short = (total - 0.9 * 80 * GIB) / GB
    usable = 0.9 * 80 * GIB / GB
    assert (
        f"H100 80GB (80 GiB = 85.899 GB, 90% usable = {usable:.3f} GB): does not fit by "
        f"{short:.3f} GB"
    ) in lines
    # ZeRO-3, one micro-batch: 1.5 x the all-reduce of 70e9 16-bit gradients over 64
    sent = 1.5 * 2 * 63 / 64 * 2 * 70e9
    assert _value(lines, "data parallel over 64:") == pytest.approx(sent / GB, abs=TOL)
    # exercise 5's peak counts naive attention: the working layer's 194 sbh
    naive = total - 34 * sbh + 194 * sbh
    assert _value(lines, "check: peak_bytes_per_gpu gives") == pytest.approx(naive / GB, abs=TOL)
    assert f"without FlashAttention: {naive / GB:.3f} GB" in lines[-1]


def test_naive_attention_and_selective_recomputation_are_separate_choices():
    sbh = 4096 * 8192
    naive = dict(explore.DEFAULTS, flash_attention=False)
    stored = {"none": 194, "selective": 34, "full": 2}
    for mode, per_layer in stored.items():
        lines = explore.view(dict(naive, recompute=mode)).lines
        # 79 layers store what the mode keeps; the layer being processed rebuilds its scores
        expected = (79 * per_layer + 194) * sbh
        assert _value(lines, "activations") == pytest.approx(expected / GB, abs=TOL)
        flash = explore.view(dict(explore.DEFAULTS, recompute=mode)).lines
        kept = 2 if mode == "full" else 34
        assert _value(flash, "activations") == pytest.approx((79 * kept + 34) * sbh / GB, abs=TOL)


def test_a_tensor_and_pipeline_layout_matches_the_package_models():
    settings = dict(explore.DEFAULTS, model="llama3-70b", tensor=8, pipeline=4, gpus=128)
    settings.update(zero_stage=1, sequence_parallel=True, micro_batches=8, recompute="full")
    lines = explore.view(settings).lines
    _, model = PRESETS["llama3-70b"]
    assert f"model: Llama-3 70B, {model.num_params / 1e9:,.2f} B parameters" in lines[0]
    assert "70.55 B" in lines[0] and "SwiGLU" in lines[0]
    assert "64 heads sharing 8 KV heads, SwiGLU MLP of width 28,672" in lines[1]
    model = replace(model, seq_len=4096)
    layout = Layout(8, 4, 4, 1, 1, "full")
    busiest = memory.gpu_memory(model, layout, micro_batches=8)
    assert _value(lines, "total ") == pytest.approx(sum(busiest.values()) / GB, abs=TOL)
    assert _value(lines, "activations") == pytest.approx(busiest["activations"] / GB, abs=TOL)
    n = model.num_params
    data = comm.sharded_step_bytes_sent(n / 32, zero_stage=1, world_size=4, micro_batches=8)
    assert _value(lines, "data parallel over 4:") == pytest.approx(data / GB, abs=TOL)
    # 6 all-reduces (full recompute) per layer of the stage, per micro-batch, of b s h 2-byte
    # values over 8 ranks; the pipeline sends an activation and a gradient per micro-batch.
    tensor = 6 * 20 * 8 * comm.ring_allreduce_bytes_sent(4096 * 8192 * 2, 8)
    assert _value(lines, "tensor parallel over 8:") == pytest.approx(tensor / GB, abs=TOL)
    assert _value(lines, "pipeline over 4:") == pytest.approx(2 * 8 * 4096 * 8192 * 2 / GB, abs=TOL)
    assert not any(line.startswith("check:") for line in lines)  # the exercise has no t, p


def test_custom_shape_with_gqa_and_swiglu():
    settings = dict(explore.DEFAULTS, model="custom", layers=4, hidden=256, heads=8, kv_heads=2)
    settings.update(mlp="swiglu", ffn_hidden=768, vocab=1000, seq_len=128, gpus=8, zero_stage=0)
    lines = explore.view(settings).lines
    model = TransformerShape(4, 256, 8, 1000, 128, kv_heads=2, ffn_hidden=768, mlp="swiglu")
    assert f"{model.num_params / 1e9:,.2f} B parameters" in lines[0]
    expected = memory.gpu_memory(model, Layout(data=8, recompute="selective"))
    assert _value(lines, "total ") == pytest.approx(sum(expected.values()) / GB, abs=TOL)
    assert not any(line.startswith("check:") for line in lines)  # not exercise 4's layer


def test_settings_the_models_reject_raise_value_error():
    for bad, match in [
        (dict(tensor=3), "must divide the 64 GPUs"),
        (dict(gpus=96, tensor=3), "must divide the 64 heads"),
        (dict(pipeline=3, gpus=96), "must divide the 80 layers"),
        (dict(pipeline=2, zero_stage=2), "not combined with pipeline"),
        (dict(model="custom", hidden=100, heads=32), "multiple of heads"),
    ]:
        with pytest.raises(ValueError, match=match):
            explore.view(dict(explore.DEFAULTS, **bad))


def test_the_panel_starts_at_the_defaults_and_redraws_on_a_move():
    panel = explore.explorer()
    assert panel.settings() == explore.DEFAULTS
    assert panel.last is None  # nothing drawn when built
    panel.controls["model"].value = "llama3-8b"
    assert panel.last.lines == explore.view(dict(explore.DEFAULTS, model="llama3-8b")).lines
    assert panel.last.lines != explore.view(explore.DEFAULTS).lines
    panel.controls["zero_stage"].value = 1
    expected = explore.view(dict(explore.DEFAULTS, model="llama3-8b", zero_stage=1))
    assert panel.last.lines == expected.lines


def _blank(*args, **kwargs):
    raise NotImplementedError


def test_blank_exercises_fall_back_to_the_package_and_say_so():
    panel = explore.explorer(_blank, _blank, _blank, _blank)
    panel.button.click()
    assert panel.last.lines == explore.view(explore.DEFAULTS).lines
    for name in ("state_bytes_per_gpu", "layer_activation_bytes", "bytes_sent_per_step",
                 "peak_bytes_per_gpu"):  # fmt: skip
        assert f"your {name} is still blank: the package's" in panel.note.value


def test_the_students_functions_are_used_when_given():
    def state(num_params, zero_stage, world_size, *, weight_bytes=2, grad_bytes=2,
              optimizer_bytes=12):  # fmt: skip
        return num_params * (weight_bytes + grad_bytes + optimizer_bytes)  # forgets sharding

    def layer(seq_len, micro_batch, hidden, heads, recompute="none"):
        return 1e9

    def sent(num_params, zero_stage, world_size, *, weight_bytes=2, grad_bytes=2,
             micro_batches=1):  # fmt: skip
        return 7e9

    def peak(*args, **kwargs):
        return 5e9

    panel = explore.explorer(state, layer, sent, peak)
    panel.button.click()
    lines = panel.last.lines
    assert _value(lines, "optimizer") == pytest.approx(12 * 70e9 / GB, abs=TOL)
    assert _value(lines, "activations") == pytest.approx(80.0)  # 79 stored + 1 working
    assert _value(lines, "data parallel over 64:") == pytest.approx(7.0)
    assert _value(lines, "check: peak_bytes_per_gpu gives") == pytest.approx(5.0)
    assert "computed with your state_bytes_per_gpu" in panel.note.value
    assert "blank" not in panel.note.value and "package" not in panel.note.value
