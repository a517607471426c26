"""Section 03's planner explorer: a model, a cluster and a batch -> the ranked 3D layouts.

:func:`distopt.costs.planner.plan` enumerates the layouts (tensor x pipeline x data, ZeRO
stage, micro-batch, recomputation), keeps those that fit in the usable part of a GPU's memory
and ranks them by estimated step time, then by bytes sent, then by memory held. The readout
lists the first with their memory per GPU, step time and MFU, each beside its parts; the
figure stacks each layout's step time: compute, bubble and exposed communication (tensor,
context, expert, pipeline, data parallel). (The notebook's exercises use the same
cost model to choose a layout and a number of servers; the explorer shows the whole ranking.)
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from distopt.costs import planner
from distopt.explore.panel import Panel, View
from distopt.units import GB, GIB, H100_MEMORY_BYTES, gbit_per_s

__all__ = ["DEFAULTS", "MODELS", "explorer", "view"]

# The notebook's two models: the lesson's ~1B plan model and GPT-3 175B.
MODELS = {
    "1b": ("1.3B (the lesson's plan model)", planner.ModelSpec(24, 2048, 16, 50304, 2048)),
    "gpt3": ("GPT-3 175B", planner.ModelSpec(96, 12288, 96, 51200, 2048)),
}
FLOPS_PER_S = 400e12  # sustained 16-bit FLOP/s per GPU, as in the notebook
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)
SERVER_SIZES = (4, 8)
INTRA = (  # bytes/s per GPU and direction inside a server
    ("NVLink 5 (B200), 900 GB/s", 900 * GB),
    ("NVLink 4 (H100), 450 GB/s", 450 * GB),
    ("NVLink 3 (A100), 300 GB/s", 300 * GB),
    ("PCIe 5 x16, 64 GB/s", 64 * GB),
)
INTER = tuple(  # bytes/s per GPU between servers
    (f"{name}, {gbits} Gb/s = {gbit_per_s(gbits) / GB:g} GB/s", gbit_per_s(gbits))
    for name, gbits in (("XDR InfiniBand", 800), ("NDR InfiniBand", 400),
                        ("HDR InfiniBand", 200), ("100 GbE", 100))
)  # fmt: skip
MEMORIES = (
    ("40 GiB (A100)", 40 * GIB),
    ("80 GiB (H100)", H100_MEMORY_BYTES),
    ("141 GB (H200)", 141 * GB),
)
DEFAULTS: dict[str, object] = {
    "model": "1b",
    "num_gpus": 64,
    "gpus_per_server": 8,
    "intra_bandwidth": 450 * GB,
    "inter_bandwidth": gbit_per_s(400),
    "memory_bytes": H100_MEMORY_BYTES,
    "global_batch": 512,
    "sharded_zero": True,
}
ROWS = 8
PARTS = (("compute", "tab:blue"), ("bubble", "tab:gray"), ("tensor", "tab:orange"),
         ("context", "tab:purple"), ("expert", "tab:brown"), ("pipeline", "tab:green"),
         ("data", "tab:red"))  # fmt: skip


def layout_memory_total(model: planner.ModelSpec, layout: planner.Layout, batch: int) -> float:
    """Peak bytes per GPU: the sum of :func:`distopt.costs.planner.memory_per_gpu`'s parts."""
    return sum(planner.memory_per_gpu(model, layout, batch).values())


def _label(layout: planner.Layout) -> str:
    recompute = " R" if layout.recompute == "full" else ""
    return (f"t{layout.tensor} p{layout.pipeline} d{layout.data} ZeRO-{layout.zero_stage} "
            f"b{layout.micro_batch}{recompute}")  # fmt: skip


def view(settings: dict) -> View:
    """The planner's ranking for ``settings`` (keys as in :data:`DEFAULTS`): table and bars."""
    if settings["model"] not in MODELS:
        raise ValueError(f"model must be one of {tuple(MODELS)}, got {settings['model']!r}")
    name, model = MODELS[settings["model"]]
    n, per_server = settings["num_gpus"], settings["gpus_per_server"]
    batch = settings["global_batch"]
    for key, value in (("num_gpus", n), ("gpus_per_server", per_server), ("global_batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    if n % per_server:
        raise ValueError(f"{n} GPUs do not fill whole servers of {per_server}")
    cluster = planner.ClusterSpec(
        num_gpus=n,
        gpus_per_server=per_server,
        memory_bytes=settings["memory_bytes"],
        intra_bandwidth=settings["intra_bandwidth"],
        inter_bandwidth=settings["inter_bandwidth"],
        flops_per_s=FLOPS_PER_S,
    )
    stages = (0, 1, 2, 3) if settings["sharded_zero"] else (0, 1)
    options = list(planner.layouts(model, cluster, batch, zero_stages=stages))
    ranked = planner.plan(model, cluster, batch, zero_stages=stages)
    lines = [
        f"{name}: {model.num_params / 1e9:.2f} billion parameters; {batch} sequences of "
        f"{model.seq_len} tokens per step",
        f"{n} GPUs, {per_server} per server, {cluster.memory_bytes / GB:.1f} GB and "
        f"{FLOPS_PER_S / 1e12:g} TFLOP/s each",
        f"links per GPU: {cluster.intra_bandwidth / GB:g} GB/s inside a server, "
        f"{cluster.inter_bandwidth / GB:g} GB/s between servers; ZeRO stages "
        + ", ".join(str(s) for s in stages),
        f"{len(options)} layouts divide the GPUs and the batch; {len(ranked)} fit in "
        f"{planner.USABLE_FRACTION:.0%} of {cluster.memory_bytes / GB:.1f} GB",
    ]
    if not ranked:
        if options:
            least = min(options, key=lambda lay: layout_memory_total(model, lay, batch))
            lines.append(f"the smallest needs {layout_memory_total(model, least, batch) / GB:.1f}"
                         f" GB per GPU ({_label(least)})")  # fmt: skip
        figure = Figure(figsize=(9, 1.5))
        figure.text(0.5, 0.5, "no layout fits", ha="center", va="center")
        return View(lines, figure)
    top = [layout for layout, _, _ in ranked[:ROWS]]
    lines += [
        f"the {len(top)} first (memory in GB per GPU, times in seconds per step, MFU against "
        f"{cluster.peak_flops_per_s / 1e12:g} TFLOP/s):",
        f"{'t':>3s} {'p':>3s} {'d':>3s} {'ZeRO':>4s} {'b':>2s} {'recomp':>6s} | {'GB/GPU':>6s} "
        f"{'state':>6s} {'activ':>6s} | {'s/step':>7s} {'MFU':>5s} {'compute':>7s} {'bubble':>7s} "
        f"{'tensor':>7s} {'context':>7s} {'expert':>7s} {'pipe':>7s} {'data':>7s}",
    ]
    breakdowns = []
    for layout in top:
        held = planner.memory_per_gpu(model, layout, batch)
        parts = planner.step_time_breakdown(model, cluster, layout, batch)
        peak, seconds = sum(held.values()), sum(parts.values())
        breakdowns.append(parts)
        lines.append(
            f"{layout.tensor:3d} {layout.pipeline:3d} {layout.data:3d} {layout.zero_stage:4d} "
            f"{layout.micro_batch:2d} {'yes' if layout.recompute == 'full' else 'no':>6s} | "
            f"{peak / GB:6.1f} {(held['state'] + held['gathered']) / GB:6.1f} "
            f"{(held['activations'] + held.get('logits', 0.0)) / GB:6.1f} | {seconds:7.3f} "
            f"{planner.mfu(model, cluster, batch, seconds):5.1%} "
            + " ".join(f"{parts[key]:7.3f}" for key, _ in PARTS)
        )
    figure = Figure(figsize=(10, 1.4 + 0.42 * len(top)))
    ax = figure.add_subplot()
    rows = range(len(top))
    left = [0.0] * len(top)
    for key, color in PARTS:
        widths = [parts[key] for parts in breakdowns]
        label = key if key in ("compute", "bubble") else f"{key} communication"
        ax.barh(rows, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(list(rows), [_label(layout) for layout in top])
    ax.invert_yaxis()
    ax.set(xlabel="seconds per step", title=f"{name} on {n} GPUs: the fastest layouts")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    return View(lines, figure)


def explorer() -> Panel:
    """The panel."""
    style = {"description_width": "initial"}

    def dropdown(key: str, options, description: str) -> widgets.Dropdown:
        return widgets.Dropdown(
            options=options, value=DEFAULTS[key], description=description, style=style
        )

    controls = {
        "model": dropdown("model", [(label, key) for key, (label, _) in MODELS.items()], "model"),
        "num_gpus": dropdown("num_gpus", GPU_COUNTS, "GPUs"),
        "gpus_per_server": dropdown("gpus_per_server", SERVER_SIZES, "GPUs per server"),
        "intra_bandwidth": dropdown("intra_bandwidth", INTRA, "inside a server"),
        "inter_bandwidth": dropdown("inter_bandwidth", INTER, "between servers"),
        "memory_bytes": dropdown("memory_bytes", MEMORIES, "memory per GPU"),
        "global_batch": widgets.BoundedIntText(
            value=DEFAULTS["global_batch"],
            min=1,
            max=65536,
            description="global batch (sequences)",
            style=style,
        ),
        "sharded_zero": widgets.Checkbox(
            value=DEFAULTS["sharded_zero"],
            description="allow ZeRO-2 and 3 (without a pipeline)",
            style=style,
        ),
    }
    return Panel(
        "planner",
        "The 3D-parallelism planner: layouts that fit, fastest first",
        controls,
        view,
    )
