"""Section 02's explorer: what one GPU holds in training, and what each choice sends per step.

A model (a preset or a custom shape), a number of GPUs split into tensor x pipeline x data
parallel groups, a ZeRO stage, sequence parallelism, recomputation, the micro-batch and the
sequence length give the peak bytes of the busiest GPU by part
(:func:`distopt.costs.layout_memory.parallel_training_breakdown`), against an accelerator's memory,
and the bytes each GPU sends per step: the ZeRO stage's collectives
(:func:`distopt.costs.comm.sharded_step_bytes_sent`) and the tensor and pipeline traffic that
section 03's planner counts (:func:`distopt.costs.planner.step_time_breakdown`).

The notebook's own functions compute what they cover: ``state_bytes_per_gpu`` each part of the
training state, ``layer_activation_bytes`` a layer's activations (without tensor parallelism),
``bytes_sent_per_step`` the data-parallel traffic and ``peak_bytes_per_gpu`` a check total.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets
from matplotlib.figure import Figure

from distopt.costs import comm, layout_memory, memory, planner, transformer
from distopt.explore.panel import Answer, Panel, View
from distopt.units import GB, GIB

# key: (label, layers, hidden, heads, vocab, context); the lesson's model keeps its 70e9.
PRESETS = {
    "lesson-70b": ("the lesson's 70B", 80, 8192, 64, 32_000, None),
    "gpt3-175b": ("GPT-3 175B", 96, 12288, 96, 50_257, 2048),
    "llama3-8b": ("Llama-3 8B", 32, 4096, 32, 128_256, 8192),
    "llama3-70b": ("Llama-3 70B", 80, 8192, 64, 128_256, 8192),
    "llama3-405b": ("Llama-3 405B", 126, 16384, 128, 128_256, 8192),
    "custom": ("custom shape", None, None, None, None, None),
}
# key: (label, bytes, how the vendor's figure reads)
ACCELERATORS = {
    "a100-40gb": ("A100 40GB", 40 * GIB, "40 GiB"),
    "a100-80gb": ("A100 80GB", 80 * GIB, "80 GiB"),
    "h100-80gb": ("H100 80GB", 80 * GIB, "80 GiB"),
    "h200-141gb": ("H200 141GB", 141 * GB, "141 GB as NVIDIA states it"),
}
PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "gathered")
LABELS = dict(zip(PARTS, ("weights", "gradients", "optimizer", "activations", "logits",
                         "gathered layer"), strict=True))  # fmt: skip
COLORS = ("tab:blue", "tab:cyan", "tab:purple", "tab:green", "tab:olive", "tab:orange")
COLLECTIVES = {
    0: "an all-reduce of the gradients",
    1: "a reduce-scatter of the gradients, an all-gather of the weights",
    2: "a reduce-scatter of the gradients per micro-batch, one all-gather of the weights",
    3: "per micro-batch, two all-gathers of the weights and a reduce-scatter of the gradients",
}

DEFAULTS: dict[str, object] = {
    "model": "lesson-70b",
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "vocab": 32_000,
    "gpus": 64,
    "zero_stage": 3,
    "tensor": 1,
    "pipeline": 1,
    "sequence_parallel": False,
    "recompute": "selective",
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
    return memory.activation_bytes_per_layer(seq_len, micro_batch, hidden, heads,
                                             recompute=recompute)  # fmt: skip


def _sent(num_params, zero_stage, world_size, **kwargs):
    return comm.sharded_step_bytes_sent(
        num_params, zero_stage=zero_stage, world_size=world_size, **kwargs
    )


_peak = memory.peak_training_bytes


def _model(s: dict) -> tuple[str, int, int, int, int, float, str]:
    """(label, layers, hidden, heads, vocab, parameters, what the count means)."""
    if s["model"] not in PRESETS:
        raise ValueError(f"model must be one of {tuple(PRESETS)}, got {s['model']!r}")
    label, layers, hidden, heads, vocab, context = PRESETS[s["model"]]
    gpt_style = "a GPT-style count (Narayanan et al.)"
    if s["model"] == "custom":
        layers, hidden, heads, vocab = (int(s[k]) for k in ("layers", "hidden", "heads", "vocab"))
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        n = transformer.param_count(layers, hidden, vocab, int(s["seq_len"]))
        return label, layers, hidden, heads, vocab, n, gpt_style
    if context is None:  # the lesson counts 70e9; the shape (Llama 2 70B's) sizes activations
        return label, layers, hidden, heads, vocab, 70e9, "the lesson's count, Llama 2 70B's shape"
    n = transformer.param_count(layers, hidden, vocab, context)
    if s["model"].startswith("llama"):
        gpt_style = (
            "taken as a GPT-style model of this shape: 12 h^2 per layer, tied embeddings; "
            "Llama's SwiGLU MLP, grouped-query attention and untied embeddings give other "
            "parameter and activation counts"
        )
    return label, layers, hidden, heads, vocab, n, gpt_style


def _gpu(s, shape, zero_stage, stage, state, layer) -> dict[str, float]:
    """Bytes by part on a GPU of pipeline stage ``stage``: the package's breakdown, with the
    notebook's functions for the state and (tensor 1) the layers' activations."""
    _, layers, hidden, heads, vocab, n = shape[:6]
    t, p, d = s["tensor"], s["pipeline"], s["gpus"] // (s["tensor"] * s["pipeline"])
    sb = (int(s["seq_len"]), int(s["micro_batch"]))
    m = int(s["micro_batches"])
    parts = layout_memory.parallel_training_breakdown(
        n, layers, *sb, hidden, heads, zero_stage=zero_stage, data_parallel=d,
        tensor_parallel=t, pipeline_parallel=p, sequence_parallel=s["sequence_parallel"],
        recompute=s["recompute"], micro_batches=m, stage=stage, vocab=vocab,
    )  # fmt: skip
    for part, widths in (
        ("weights", (2, 0, 0)),
        ("gradients", (0, 2, 0)),
        ("optimizer", (0, 0, 12)),
    ):
        parts[part] = state(n / (t * p), zero_stage, d, **dict(zip(
            ("weight_bytes", "grad_bytes", "optimizer_bytes"), widths, strict=True)))  # fmt: skip
    if t == 1:  # sequence parallelism changes nothing on one tensor rank
        parts["activations"] = layout_memory.stage_activation_bytes(
            layer(*sb, hidden, heads, s["recompute"]), layer(*sb, hidden, heads, "none"),
            num_layers=layers, pipeline_parallel=p, micro_batches=m, stage=stage,
        )  # fmt: skip
    return parts


def _busiest(s, shape, zero_stage, state, layer) -> tuple[int, dict[str, float]]:
    """The pipeline stage (first: most micro-batches in flight; last: the logits) whose GPU
    holds the most, with its parts; the middle stages hold less than the first."""
    stages = {0, s["pipeline"] - 1}
    found = [(i, _gpu(s, shape, zero_stage, i, state, layer)) for i in sorted(stages)]
    return max(found, key=lambda item: sum(item[1].values()))


def _traffic(s, shape, zero_stage, sent) -> dict[str, float]:
    """Bytes one GPU sends per step: data-parallel (the ZeRO stage), tensor and pipeline."""
    _, layers, hidden, heads, vocab, n = shape[:6]
    t, p, b, m = s["tensor"], s["pipeline"], s["micro_batch"], s["micro_batches"]
    d = s["gpus"] // (t * p)
    spec = planner.ModelSpec(layers, hidden, heads, vocab, int(s["seq_len"]))
    layout = planner.Layout(t, p, d, zero_stage, b, s["recompute"] == "full")
    # At 1 byte/s on every link, the planner's seconds of tensor and pipeline traffic are bytes.
    unit = planner.ClusterSpec(s["gpus"], s["gpus"], float("inf"), 1.0, 1.0, 1.0)
    seconds = planner.step_time_breakdown(spec, unit, layout, m * d * b)
    data = sent(n / (t * p), zero_stage, d, micro_batches=m)
    return {"data": data, "tensor": seconds["tensor"], "pipeline": seconds["pipeline"]}


def _check(s: dict, layers: int, heads: int) -> None:
    t, p, n = s["tensor"], s["pipeline"], s["gpus"]
    if min(t, p, n, s["micro_batch"], s["micro_batches"], s["seq_len"]) < 1:
        raise ValueError("GPUs, degrees, micro-batches and sequence length must be >= 1")
    if n % (t * p):
        raise ValueError(f"tensor x pipeline ({t} x {p}) must divide the {n} GPUs")
    if heads % t:
        raise ValueError(f"the tensor degree {t} must divide the {heads} heads")
    if layers % p:
        raise ValueError(f"the pipeline degree {p} must divide the {layers} layers")
    if s["accelerator"] not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {tuple(ACCELERATORS)}")


def view(
    settings: dict,
    *,
    state_bytes_per_gpu: Callable | None = None,
    layer_activation_bytes: Callable | None = None,
    bytes_sent_per_step: Callable | None = None,
    peak_bytes_per_gpu: Callable | None = None,
) -> View:
    """The busiest GPU's bytes by part for each ZeRO stage, and the bytes sent per step."""
    s = {**DEFAULTS, **settings}
    state, layer = state_bytes_per_gpu or _state, layer_activation_bytes or _layer
    sent, peak = bytes_sent_per_step or _sent, peak_bytes_per_gpu or _peak
    shape = _model(s)
    label, layers, hidden, heads, vocab, n, counted = shape
    _check(s, layers, heads)
    zs, t, p = s["zero_stage"], s["tensor"], s["pipeline"]
    d = s["gpus"] // (t * p)
    if zs not in memory.ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}, got {zs!r}")
    if zs >= 2 and p > 1:
        raise ValueError("ZeRO-2 and ZeRO-3 are not combined with pipeline parallelism "
                         "(DeepSpeed refuses it; section 03's planner follows)")  # fmt: skip
    stages = [z for z in memory.ZERO_STAGES if z < 2 or p == 1]
    gpus = {z: _busiest(s, shape, z, state, layer) for z in stages}
    traffic = {z: _traffic(s, shape, z, sent) for z in stages}
    acc_label, capacity, figure_reads = ACCELERATORS[s["accelerator"]]
    stage_index, parts = gpus[zs]
    total = sum(parts.values())
    sequence = "on" if s["sequence_parallel"] else "off"
    lines = [
        f"model: {label}, {n / 1e9:,.2f} B parameters ({counted})",
        f"shape: {layers} layers, hidden {hidden}, {heads} heads, vocabulary {vocab:,}",
        f"layout: {s['gpus']} GPUs = tensor {t} x pipeline {p} x data {d}; ZeRO-{zs}; "
        f"recompute {s['recompute']}; sequence parallel {sequence}"
        + (" (no effect at tensor 1)" if t == 1 else ""),
        f"micro-batch {s['micro_batch']} x {s['seq_len']:,} tokens, "
        f"{s['micro_batches']} micro-batch(es) per step",
        f"busiest GPU: pipeline stage {stage_index + 1} of {p}, GB per GPU:",
        *(f"  {LABELS[part]:14s} {parts[part] / GB:10.3f}" for part in PARTS),
        f"  {'total':14s} {total / GB:10.3f}",
    ]
    if t > 1:
        lines.append("  (activations with tensor parallelism: the package's "
                     "activation_bytes_per_layer; the exercise's has no t)")  # fmt: skip
    margin = (capacity - total) / GB
    verdict = (
        f"fits, {margin:.3f} GB to spare" if margin >= 0 else f"does not fit by {-margin:.3f} GB"
    )
    lines.append(f"{acc_label} ({figure_reads} = {capacity / GB:.3f} GB): {verdict}")
    sent_now = traffic[zs]
    per_layer = 6 if s["recompute"] == "full" else 4
    tensor_how = "none" if t == 1 else (
        f"{per_layer} all-reduces of b s h 16-bit values per layer and micro-batch"
        + (", as reduce-scatter + all-gather pairs" if s["sequence_parallel"] else "")
    )  # fmt: skip
    pipe_how = "none" if p == 1 else "b s h activations forward, their gradients back"
    lines += [
        "sent per GPU per step, GB:",
        f"  data parallel over {d}: {sent_now['data'] / GB:.3f} ({COLLECTIVES[zs]})",
        f"  tensor parallel over {t}: {sent_now['tensor'] / GB:.3f} ({tensor_how})",
        f"  pipeline over {p}: {sent_now['pipeline'] / GB:.3f} ({pipe_how}, per micro-batch)"
        if p > 1
        else f"  pipeline over {p}: {sent_now['pipeline'] / GB:.3f} (none)",
        f"  total: {sum(sent_now.values()) / GB:.3f}",
    ]
    if t == 1 and p == 1:
        check = peak(n, layers, s["seq_len"], s["micro_batch"], hidden, heads, zero_stage=zs,
                     world_size=d, recompute=s["recompute"], vocab=vocab)  # fmt: skip
        lines.append(f"check: peak_bytes_per_gpu gives {check / GB:.3f} GB")
    return View(lines, _figure(gpus, traffic, zs, capacity, f"{acc_label} ({figure_reads})", label))


def _figure(gpus, traffic, chosen, capacity, acc_label, model_label) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_mem, ax_comm = fig.subplots(1, 2)
    names = [f"ZeRO-{z}" for z in gpus]
    bottom = [0.0] * len(names)
    for part, color in zip(PARTS, COLORS, strict=True):
        heights = [parts[part] / GB for _, parts in gpus.values()]
        ax_mem.bar(names, heights, bottom=bottom, color=color, label=LABELS[part])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax_mem.axhline(capacity / GB, color="black", linestyle="--", label=acc_label)
    ax_mem.set(ylabel="GB on the busiest GPU", title=f"{model_label}: memory per GPU")
    ax_mem.legend(fontsize=7)
    bottom = [0.0] * len(names)
    for kind, color in (("data", "tab:pink"), ("tensor", "tab:red"), ("pipeline", "tab:brown")):
        heights = [sent[kind] / GB for sent in traffic.values()]
        ax_comm.bar(names, heights, bottom=bottom, color=color, label=kind)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
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
        Answer("state_bytes_per_gpu", state_bytes_per_gpu, _state,
               "distopt.costs.memory.training_state_bytes"),
        Answer("layer_activation_bytes", layer_activation_bytes, _layer,
               "distopt.costs.memory.activation_bytes_per_layer"),
        Answer("bytes_sent_per_step", bytes_sent_per_step, _sent,
               "distopt.costs.comm.sharded_step_bytes_sent"),
        Answer("peak_bytes_per_gpu", peak_bytes_per_gpu, _peak,
               "distopt.costs.memory.peak_training_bytes"),
    )  # fmt: skip
    style = {"description_width": "initial"}
    d = DEFAULTS

    def number(key, label, low, high):
        return widgets.BoundedIntText(value=d[key], min=low, max=high, description=label,
                                      style=style)  # fmt: skip

    def choice(key, label, options, kind=widgets.Dropdown):
        return kind(options=options, value=d[key], description=label, style=style)

    controls = {
        "model": choice("model", "model", [(v[0], k) for k, v in PRESETS.items()]),
        "layers": number("layers", "custom: layers", 1, 1000),
        "hidden": number("hidden", "custom: hidden", 1, 65536),
        "heads": number("heads", "custom: heads", 1, 1024),
        "vocab": number("vocab", "custom: vocabulary", 1, 1_000_000),
        "gpus": number("gpus", "GPUs", 1, 1 << 20),
        "zero_stage": choice("zero_stage", "ZeRO stage", [0, 1, 2, 3], widgets.ToggleButtons),
        "tensor": number("tensor", "tensor parallel", 1, 1024),
        "pipeline": number("pipeline", "pipeline stages", 1, 1024),
        "sequence_parallel": widgets.Checkbox(value=d["sequence_parallel"],
                                              description="sequence parallel", style=style),
        "recompute": choice("recompute", "recompute", list(memory.RECOMPUTE_MODES),
                            widgets.ToggleButtons),
        "micro_batch": number("micro_batch", "micro-batch (sequences)", 1, 4096),
        "micro_batches": number("micro_batches", "micro-batches per step", 1, 4096),
        "seq_len": number("seq_len", "sequence length", 1, 1 << 20),
        "accelerator": choice("accelerator", "accelerator",
                              [(v[0], k) for k, v in ACCELERATORS.items()]),
    }  # fmt: skip
    return Panel(
        "memory",
        "Memory per GPU and communication per step (section 02)",
        controls,
        lambda s: view(s, state_bytes_per_gpu=answers[0], layer_activation_bytes=answers[1],
                       bytes_sent_per_step=answers[2], peak_bytes_per_gpu=answers[3]),
        answers=answers,
    )  # fmt: skip
