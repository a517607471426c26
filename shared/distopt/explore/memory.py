"""Section 02's explorer: what one GPU holds in training, and what each choice sends per step.

A model (a preset or a custom shape), a number of GPUs split into tensor x pipeline x data
parallel groups, a ZeRO stage, sequence parallelism, recomputation, FlashAttention, the
micro-batch and the sequence length make a :class:`distopt.costs.shape.TransformerShape` and a
:class:`distopt.costs.shape.Layout`. The busiest GPU's bytes by part are the course's one memory
model (:func:`distopt.costs.memory.busiest_stage`), against an accelerator's memory and the
usable share of it (:data:`distopt.costs.memory.USABLE_FRACTION`); the bytes each GPU sends per
step are section 03's :func:`distopt.costs.planner.traffic_bytes`.

The notebook's own functions compute what they cover: ``state_bytes_per_gpu`` each part of the
training state, ``layer_activation_bytes`` a GPT-style layer's activations without tensor
parallelism, ``bytes_sent_per_step`` the data-parallel traffic and ``peak_bytes_per_gpu`` a
check total (naive attention, as exercise 5 counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import ipywidgets as widgets
from matplotlib.figure import Figure

from distopt.costs import comm, memory, planner, shape
from distopt.costs.shape import Layout, TransformerShape
from distopt.explore.panel import Answer, Panel, View
from distopt.units import A100_80GB_MEMORY_BYTES, GB, GIB, H100_MEMORY_BYTES

LESSON_70B = TransformerShape(80, 8192, 64, 32_000, 4096, params=70e9)
# key: (label, shape or None for the custom controls, what the parameter count is)
PRESETS: dict[str, tuple[str, TransformerShape | None, str]] = {
    "lesson-70b": (
        "the lesson's 70B",
        LESSON_70B,
        "the lesson's round count; GPT-style layers of hidden 8192, 64 heads",
    ),
    **{
        key: (label, model, "the published model: SwiGLU, 8 KV heads, untied embeddings")
        for key, (label, model) in shape.PRESETS.items()
        if key.startswith("llama3")
    },
    "gpt3-175b": (
        "GPT-3 175B",
        shape.PRESETS["gpt3-175b"][1],
        "GPT-style: Narayanan et al.'s count",
    ),
    "custom": ("custom shape", None, "counted from the shape"),
}
# key: (label, bytes, how the vendor's figure reads)
ACCELERATORS = {
    "a100-40gb": ("A100 40GB", 40 * GIB, "40 GiB"),
    "a100-80gb": ("A100 80GB", A100_80GB_MEMORY_BYTES, "80 GiB"),
    "h100-80gb": ("H100 80GB", H100_MEMORY_BYTES, "80 GiB"),
    "h200-141gb": ("H200 141GB", 141 * GB, "141 GB as NVIDIA states it"),
}
PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "gathered")
LABELS = {part: part for part in PARTS} | {"gathered": "gathered layer"}
COLORS = ("tab:blue", "tab:cyan", "tab:purple", "tab:green", "tab:olive", "tab:orange")
MLP_NAMES = {"gelu": "GELU", "swiglu": "SwiGLU"}
TRAFFIC = (("data", "tab:pink"), ("tensor", "tab:red"), ("pipeline", "tab:brown"))
COLLECTIVES = {
    0: "an all-reduce of the gradients",
    1: "a reduce-scatter of the gradients, an all-gather of the weights",
    2: "a reduce-scatter of the gradients per micro-batch, one all-gather of the weights",
    3: "per micro-batch, two all-gathers of the weights and a reduce-scatter of the gradients",
}
STATE_WIDTHS = {
    "weights": {"weight_bytes": 2, "grad_bytes": 0, "optimizer_bytes": 0},
    "gradients": {"weight_bytes": 0, "grad_bytes": 2, "optimizer_bytes": 0},
    "optimizer": {"weight_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 12},
}

DEFAULTS: dict[str, object] = {
    "model": "lesson-70b",
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 32,
    "mlp": "gelu",
    "ffn_hidden": 16384,
    "vocab": 32_000,
    "gpus": 64,
    "zero_stage": 3,
    "tensor": 1,
    "pipeline": 1,
    "sequence_parallel": False,
    "recompute": "selective",
    "flash_attention": True,
    "micro_batch": 1,
    "micro_batches": 1,
    "seq_len": 4096,
    "accelerator": "h100-80gb",
}


def _state(num_params, zero_stage, world_size, **widths):
    return memory.training_state_bytes(
        num_params, zero_stage=zero_stage, world_size=world_size, **widths
    )


def _layer(seq_len, micro_batch, hidden, heads, recompute="none"):
    return memory.activation_bytes_per_layer(
        seq_len, micro_batch, hidden, heads, recompute=recompute
    )


def _sent(num_params, zero_stage, world_size, **kwargs):
    return comm.sharded_step_bytes_sent(
        num_params, zero_stage=zero_stage, world_size=world_size, **kwargs
    )


_peak = memory.peak_training_bytes


def model_of(settings: dict) -> tuple[str, TransformerShape, str]:
    """(label, shape, what the parameter count is) of the chosen preset or custom shape."""
    key = settings["model"]
    if key not in PRESETS:
        raise ValueError(f"model must be one of {tuple(PRESETS)}, got {key!r}")
    label, preset, counted = PRESETS[key]
    seq_len = int(settings["seq_len"])
    if preset is not None:
        # the preset's count stays the published one (GPT-3 learned 2,048 positions)
        return label, replace(preset, seq_len=seq_len, params=preset.num_params), counted
    fields = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")
    layers, hidden, heads, kv_heads, ffn_hidden, vocab = (int(settings[key]) for key in fields)
    custom = TransformerShape(
        layers,
        hidden,
        heads,
        vocab,
        seq_len,
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        mlp=settings["mlp"],
    )
    return label, custom, f"{counted}, GPT-style biases and tied embeddings"


def layout_of(settings: dict, zero_stage: int) -> Layout:
    tensor, pipeline = int(settings["tensor"]), int(settings["pipeline"])
    return Layout(
        tensor=tensor,
        pipeline=pipeline,
        data=int(settings["gpus"]) // (tensor * pipeline),
        zero_stage=zero_stage,
        micro_batch=int(settings["micro_batch"]),
        recompute=settings["recompute"],
        flash_attention=bool(settings["flash_attention"]),
        sequence_parallel=bool(settings["sequence_parallel"]),
    )


def _gpt_layer(model: TransformerShape) -> bool:
    """Whether exercise 4's layer (GELU MLP of width 4h, every head its own K and V) is it."""
    return model.mlp == "gelu" and model.ffn == 4 * model.hidden and model.kv_ratio == 1


def _students_activations(model, layout, stage, micro_batches, layer) -> float:
    """The stage's activations from exercise 4's function (tensor degree 1, a GPT layer).

    With FlashAttention a layer stores what selective recomputation keeps (no scores) unless
    it keeps only its input, and the layer being processed holds no scores either."""
    stored_mode, working_mode = layout.recompute, "none"
    if layout.flash_attention:
        stored_mode = "full" if layout.recompute == "full" else "selective"
        working_mode = "selective"
    widths = (model.seq_len, layout.micro_batch, model.hidden, model.heads)
    return memory.stage_activation_bytes(
        layer(*widths, stored_mode),
        layer(*widths, working_mode),
        num_layers=model.layers,
        pipeline_parallel=layout.pipeline,
        micro_batches=micro_batches,
        stage=stage,
    )


def busiest_gpu(settings, model, layout, state, layer) -> tuple[int, dict[str, float]]:
    """(pipeline stage, bytes by part) of the GPU holding the most: the package's model, with
    the notebook's functions for the state and (tensor 1, a GPT-style layer) the activations."""
    micro_batches = int(settings["micro_batches"])
    stage, parts = memory.busiest_stage(model, layout, micro_batches=micro_batches)
    shard = model.num_params / (layout.tensor * layout.pipeline)
    for part, widths in STATE_WIDTHS.items():
        parts[part] = state(shard, layout.zero_stage, layout.data, **widths)
    if layout.tensor == 1 and _gpt_layer(model):
        parts["activations"] = _students_activations(model, layout, stage, micro_batches, layer)
    return stage, parts


def traffic(settings, model, layout, sent) -> dict[str, float]:
    """Bytes one GPU sends per step: data-parallel (the notebook's function for the ZeRO
    stage), tensor and pipeline (section 03's planner)."""
    micro_batches = int(settings["micro_batches"])
    global_batch = micro_batches * layout.data * layout.micro_batch
    kinds = planner.traffic_bytes(model, layout, global_batch)
    shard = model.num_params / (layout.tensor * layout.pipeline)
    data = sent(shard, layout.zero_stage, layout.data, micro_batches=micro_batches)
    return {"data": data, "tensor": kinds["tensor"], "pipeline": kinds["pipeline"]}


def _check(settings: dict, model: TransformerShape) -> None:
    tensor, pipeline, gpus = settings["tensor"], settings["pipeline"], settings["gpus"]
    sizes = (tensor, pipeline, gpus, settings["micro_batch"], settings["micro_batches"])
    if min(*sizes, settings["seq_len"]) < 1:
        raise ValueError("GPUs, degrees, micro-batches and sequence length must be >= 1")
    if gpus % (tensor * pipeline):
        raise ValueError(f"tensor x pipeline ({tensor} x {pipeline}) must divide the {gpus} GPUs")
    if model.heads % tensor:
        raise ValueError(f"the tensor degree {tensor} must divide the {model.heads} heads")
    if model.layers % pipeline:
        raise ValueError(f"the pipeline degree {pipeline} must divide the {model.layers} layers")
    if settings["accelerator"] not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {tuple(ACCELERATORS)}")


def _shape_line(model: TransformerShape) -> str:
    attention = (
        f"{model.heads} heads"
        if model.kv_ratio == 1
        else f"{model.heads} heads sharing {model.kv_heads_or_heads} KV heads"
    )
    return (
        f"shape: {model.layers} layers, hidden {model.hidden}, {attention}, "
        f"{MLP_NAMES[model.mlp]} MLP of width {model.ffn:,}, vocabulary {model.vocab:,}"
    )


def view(
    settings: dict,
    *,
    state_bytes_per_gpu: Callable | None = None,
    layer_activation_bytes: Callable | None = None,
    bytes_sent_per_step: Callable | None = None,
    peak_bytes_per_gpu: Callable | None = None,
) -> View:
    """The busiest GPU's bytes by part for each ZeRO stage, and the bytes sent per step."""
    chosen = {**DEFAULTS, **settings}
    state, layer = state_bytes_per_gpu or _state, layer_activation_bytes or _layer
    sent, peak = bytes_sent_per_step or _sent, peak_bytes_per_gpu or _peak
    label, model, counted = model_of(chosen)
    _check(chosen, model)
    zero_stage, tensor, pipeline = chosen["zero_stage"], chosen["tensor"], chosen["pipeline"]
    if zero_stage not in memory.ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}, got {zero_stage!r}")
    if zero_stage >= 2 and pipeline > 1:
        raise ValueError(
            "ZeRO-2 and ZeRO-3 are not combined with pipeline parallelism "
            "(DeepSpeed refuses it; section 03's planner follows)"
        )
    stages = [stage for stage in memory.ZERO_STAGES if stage < 2 or pipeline == 1]
    layouts = {stage: layout_of(chosen, stage) for stage in stages}
    gpus = {
        stage: busiest_gpu(chosen, model, layout, state, layer) for stage, layout in layouts.items()
    }
    sent_by_stage = {
        stage: traffic(chosen, model, layout, sent) for stage, layout in layouts.items()
    }
    layout = layouts[zero_stage]
    accelerator, capacity, figure_reads = ACCELERATORS[chosen["accelerator"]]
    usable = memory.USABLE_FRACTION * capacity
    busiest, parts = gpus[zero_stage]
    total = sum(parts.values())
    sequence = "on" if chosen["sequence_parallel"] else "off"
    attention = "FlashAttention" if chosen["flash_attention"] else "naive attention (s^2 scores)"
    lines = [
        f"model: {label}, {model.num_params / 1e9:,.2f} B parameters ({counted})",
        _shape_line(model),
        f"layout: {chosen['gpus']} GPUs = tensor {tensor} x pipeline {pipeline} x data "
        f"{layout.data}; ZeRO-{zero_stage}; recompute {chosen['recompute']}; {attention}; "
        f"sequence parallel {sequence}" + (" (no effect at tensor 1)" if tensor == 1 else ""),
        f"micro-batch {chosen['micro_batch']} x {chosen['seq_len']:,} tokens, "
        f"{chosen['micro_batches']} micro-batch(es) per step",
        f"busiest GPU: pipeline stage {busiest + 1} of {pipeline}, GB per GPU:",
        *(f"  {LABELS[part]:14s} {parts[part] / GB:10.3f}" for part in PARTS),
        f"  {'total':14s} {total / GB:10.3f}",
    ]
    if tensor > 1 or not _gpt_layer(model):
        lines.append(
            "  (activations: the package's layer_activation_bytes for tensor parallelism, "
            "grouped-query attention or SwiGLU; the exercise's covers a GPT layer at tensor 1)"
        )
    margin = (usable - total) / GB
    verdict = (
        f"fits, {margin:.3f} GB to spare" if margin >= 0 else f"does not fit by {-margin:.3f} GB"
    )
    lines.append(
        f"{accelerator} ({figure_reads} = {capacity / GB:.3f} GB, "
        f"{memory.USABLE_FRACTION:.0%} usable = {usable / GB:.3f} GB): {verdict}"
    )
    sent_now = sent_by_stage[zero_stage]
    per_layer = 6 if chosen["recompute"] == "full" else 4
    tensor_how = (
        "none"
        if tensor == 1
        else f"{per_layer} all-reduces of b s h 16-bit values per layer and micro-batch"
        + (", as reduce-scatter + all-gather pairs" if chosen["sequence_parallel"] else "")
    )
    pipeline_how = (
        "none"
        if pipeline == 1
        else "b s h activations forward, their gradients back, per micro-batch"
    )
    lines += [
        "sent per GPU per step, GB:",
        f"  data parallel over {layout.data}: {sent_now['data'] / GB:.3f} "
        f"({COLLECTIVES[zero_stage]})",
        f"  tensor parallel over {tensor}: {sent_now['tensor'] / GB:.3f} ({tensor_how})",
        f"  pipeline over {pipeline}: {sent_now['pipeline'] / GB:.3f} ({pipeline_how})",
        f"  total: {sum(sent_now.values()) / GB:.3f}",
    ]
    if tensor == 1 and pipeline == 1 and _gpt_layer(model):
        check = peak(
            model.num_params,
            model.layers,
            model.seq_len,
            layout.micro_batch,
            model.hidden,
            model.heads,
            zero_stage=zero_stage,
            world_size=layout.data,
            recompute=chosen["recompute"],
            vocab=model.vocab,
        )
        naive = memory.gpu_memory(model, replace(layout, flash_attention=False))
        lines.append(
            f"check: peak_bytes_per_gpu gives {check / GB:.3f} GB (naive attention, as "
            f"exercise 5 counts; this layout without FlashAttention: "
            f"{sum(naive.values()) / GB:.3f} GB)"
        )
    figure = _figure(gpus, sent_by_stage, zero_stage, capacity, usable, accelerator, label)
    return View(lines, figure)


def _figure(gpus, sent_by_stage, chosen, capacity, usable, accelerator, model_label) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_mem, ax_comm = fig.subplots(1, 2)
    names = [f"ZeRO-{stage}" for stage in gpus]
    bottom = [0.0] * len(names)
    for part, color in zip(PARTS, COLORS, strict=True):
        heights = [parts[part] / GB for _, parts in gpus.values()]
        ax_mem.bar(names, heights, bottom=bottom, color=color, label=LABELS[part])
        bottom = [low + height for low, height in zip(bottom, heights, strict=True)]
    ax_mem.axhline(capacity / GB, color="black", linestyle="--", label=accelerator)
    ax_mem.axhline(usable / GB, color="gray", linestyle=":", label="usable")
    ax_mem.set(ylabel="GB on the busiest GPU", title=f"{model_label}: memory per GPU")
    ax_mem.legend(fontsize=7)
    bottom = [0.0] * len(names)
    for kind, color in TRAFFIC:
        heights = [sent[kind] / GB for sent in sent_by_stage.values()]
        ax_comm.bar(names, heights, bottom=bottom, color=color, label=kind)
        bottom = [low + height for low, height in zip(bottom, heights, strict=True)]
    ax_comm.set(ylabel="GB sent per GPU per step", title="communication per step (chosen: bold)")
    ax_comm.legend(fontsize=7)
    for ax in (ax_mem, ax_comm):
        ax.get_xticklabels()[list(gpus).index(chosen)].set_fontweight("bold")
    return fig


def explorer(
    state_bytes_per_gpu: Callable | None = None,
    layer_activation_bytes: Callable | None = None,
    bytes_sent_per_step: Callable | None = None,
    peak_bytes_per_gpu: Callable | None = None,
) -> Panel:
    """The panel; each notebook function given is used, a blank one falls back and says so."""
    answers = (
        Answer(
            "state_bytes_per_gpu",
            state_bytes_per_gpu,
            _state,
            "distopt.costs.memory.training_state_bytes",
        ),
        Answer(
            "layer_activation_bytes",
            layer_activation_bytes,
            _layer,
            "distopt.costs.memory.activation_bytes_per_layer",
        ),
        Answer(
            "bytes_sent_per_step",
            bytes_sent_per_step,
            _sent,
            "distopt.costs.comm.sharded_step_bytes_sent",
        ),
        Answer(
            "peak_bytes_per_gpu",
            peak_bytes_per_gpu,
            _peak,
            "distopt.costs.memory.peak_training_bytes",
        ),
    )
    style = {"description_width": "initial"}

    def number(key, label, low, high):
        return widgets.BoundedIntText(
            value=DEFAULTS[key], min=low, max=high, description=label, style=style
        )

    def choice(key, label, options, kind=widgets.Dropdown):
        return kind(options=options, value=DEFAULTS[key], description=label, style=style)

    def checkbox(key, label):
        return widgets.Checkbox(value=DEFAULTS[key], description=label, style=style)

    toggles = widgets.ToggleButtons
    controls = {
        "model": choice("model", "model", [(entry[0], key) for key, entry in PRESETS.items()]),
        "layers": number("layers", "custom: layers", 1, 1000),
        "hidden": number("hidden", "custom: hidden", 1, 65536),
        "heads": number("heads", "custom: heads", 1, 1024),
        "kv_heads": number("kv_heads", "custom: KV heads", 1, 1024),
        "mlp": choice("mlp", "custom: MLP", list(shape.MLP_KINDS), toggles),
        "ffn_hidden": number("ffn_hidden", "custom: MLP width", 1, 1 << 20),
        "vocab": number("vocab", "custom: vocabulary", 1, 1_000_000),
        "gpus": number("gpus", "GPUs", 1, 1 << 20),
        "zero_stage": choice("zero_stage", "ZeRO stage", [0, 1, 2, 3], toggles),
        "tensor": number("tensor", "tensor parallel", 1, 1024),
        "pipeline": number("pipeline", "pipeline stages", 1, 1024),
        "sequence_parallel": checkbox("sequence_parallel", "sequence parallel"),
        "recompute": choice("recompute", "recompute", list(memory.RECOMPUTE_MODES), toggles),
        "flash_attention": checkbox("flash_attention", "FlashAttention"),
        "micro_batch": number("micro_batch", "micro-batch (sequences)", 1, 4096),
        "micro_batches": number("micro_batches", "micro-batches per step", 1, 4096),
        "seq_len": number("seq_len", "sequence length", 1, 1 << 20),
        "accelerator": choice(
            "accelerator", "accelerator", [(entry[0], key) for key, entry in ACCELERATORS.items()]
        ),
    }

    def draw(settings):
        return view(
            settings,
            state_bytes_per_gpu=answers[0],
            layer_activation_bytes=answers[1],
            bytes_sent_per_step=answers[2],
            peak_bytes_per_gpu=answers[3],
        )

    return Panel(
        "memory",
        "Memory per GPU and communication per step (section 02)",
        controls,
        draw,
        answers=answers,
    )
