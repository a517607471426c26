"""Section 03's pipeline explorer: a schedule's Gantt chart, its bubble and its memory.

Pick the stages p, the micro-batches m, the schedule (GPipe, 1F1B, interleaved 1F1B with v
chunks per device, ZB-H1 with the backward split into equal halves B and W) and the
backward/forward time ratio; :func:`distopt.sim.pipeline.simulate`
runs the schedule, and the readout puts its idle fraction beside the closed form
(p - 1) / (v m + p - 1) of :mod:`distopt.costs.bubbles` (or the student's
``bubble_fraction_formula``), with the micro-batches in flight per device (the student's
``max_in_flight_formula`` for GPipe and 1F1B). ZB-H1's closed form is
:func:`distopt.costs.bubbles.zero_bubble_h1_fraction`.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distopt.costs import bubbles
from distopt.explore.panel import Answer, Panel, View
from distopt.sim import pipeline as sim

__all__ = ["DEFAULTS", "explorer", "view"]

DEFAULTS: dict[str, object] = {
    "stages": 4,
    "micro_batches": 8,
    "schedule": "1f1b",
    "chunks": 2,  # used by the interleaved schedule only (the control is disabled otherwise)
    "backward_ratio": 2.0,
}
SCHEDULE_LABELS = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "interleaved 1F1B",
    "zb-h1": "ZB-H1 (B and W split)",
}
RATIOS = (("1 (equal times)", 1.0), ("2 (the usual)", 2.0), ("3 (backward recomputes)", 3.0))
MAX_DRAWN_TASKS = 512  # beyond this a Gantt chart takes seconds to draw and is unreadable


def simulated_in_flight(schedule: str, stages: int, micro_batches: int, stage: int) -> int:
    """Micro-batches with activations held at once on ``stage``, counted by the simulator."""
    return sim.max_in_flight(sim.simulate(schedule, stages, micro_batches), stage)


def _check(settings: dict) -> tuple[int, int, str, int, float]:
    p, m = settings["stages"], settings["micro_batches"]
    schedule, ratio = settings["schedule"], settings["backward_ratio"]
    if schedule not in sim.SCHEDULES:
        raise ValueError(f"schedule must be one of {sim.SCHEDULES}, got {schedule!r}")
    bubbles.check_shape(p, m, 1)
    if not ratio > 0:
        raise ValueError(f"the backward/forward time ratio must be positive, got {ratio!r}")
    if schedule != "interleaved":
        return p, m, schedule, 1, float(ratio)  # GPipe and 1F1B hold one chunk per device
    v = settings["chunks"]
    if not isinstance(v, int) or v < 2:
        raise ValueError(f"interleaving needs v >= 2 chunks per device, got {v!r} (v = 1 is 1F1B)")
    if m % p:
        raise ValueError(
            f"interleaved 1F1B sends the micro-batches through the chunks in groups of p = {p}, "
            f"so the micro-batches must be a multiple of the stages ({m} is not)"
        )
    return p, m, schedule, v, float(ratio)


def view(
    settings: dict,
    *,
    bubble_fraction_formula: Callable | None = None,
    max_in_flight_formula: Callable | None = None,
) -> View:
    """The simulated schedule of ``settings`` (keys as in :data:`DEFAULTS`): numbers and chart.

    Times are in units of one stage's forward pass of one micro-batch; a backward takes
    ``backward_ratio`` of them.
    """
    p, m, schedule, v, ratio = _check(settings)
    closed_form = bubble_fraction_formula or bubbles.bubble_fraction
    in_flight = max_in_flight_formula or simulated_in_flight
    tasks = sim.simulate(schedule, p, m, interleave=v, forward_time=1.0, backward_time=ratio)
    idle = sim.idle_fraction(tasks)
    makespan = max(t.end for t in tasks)
    work = sum(t.end - t.start for t in tasks) / p
    name = SCHEDULE_LABELS[schedule] + (f", v = {v} chunks per device" if v > 1 else "")
    if schedule == "zb-h1":
        return _zero_bubble_view(tasks, p, m, ratio, name, in_flight)
    formula = closed_form(p, m, interleave=v)
    lines = [
        f"{name}; {p} stages, {m} micro-batches, backward = {ratio:g} x forward",
        f"step: {makespan:g} time units (one unit = one stage's forward of one micro-batch), "
        f"of which each device works {work:g}",
        f"idle (bubble) fraction, simulated:  {idle:.2%}",
        f"closed form (p-1)/(vm+p-1):         {formula:.2%}   "
        f"(as overhead on the ideal time, (p-1)/(vm) = "
        f"{bubbles.bubble_overhead(p, m, interleave=v):.2%})",
    ]
    if abs(idle - formula) <= 1e-9:
        lines += [
            "they agree, at any backward/forward ratio: each device idles p-1 forward and p-1",
            "backward task lengths, (p-1)(t_f+t_b)/v, which scales with t_f+t_b as its work",
            "m(t_f+t_b) does; both assume equal stages and instant sends between them",
        ]
    else:
        lines += [
            f"they differ by {abs(idle - formula):.2%}: the simulator makes the closed form's",
            "assumptions (equal stages, instant sends), so check the formula: idle / (ideal +",
            "idle), with (p-1)/v task lengths of forward and of backward idle per device",
        ]
    held = [sim.max_in_flight(tasks, d) for d in range(p)]
    lines.append(
        "activations in flight (micro-batch chunks held at once), per device: "
        + ", ".join(str(k) for k in held)
    )
    if v == 1:
        expected = in_flight(schedule, p, m, 0)
        check = "" if expected == held[0] else f" -- the simulator counts {held[0]}"
        lines.append(f"device 0 holds {held[0]}; the formula for stage 0 gives {expected}{check}")
    else:
        plain = in_flight("1f1b", p, m, 0)
        lines.append(
            f"device 0 holds {held[0]} chunks of 1/{v} stage = {held[0] / v:g} stage units; "
            f"1F1B on the same pipeline holds {plain} (formula for stage 0)"
        )
    if len(tasks) > MAX_DRAWN_TASKS:
        lines.append(
            f"(the chart is drawn up to {MAX_DRAWN_TASKS} tasks; this setting has {len(tasks)}: "
            "fewer stages, micro-batches or chunks to see it)"
        )
        return View(lines)
    return View(lines, _chart(tasks, name, idle))


def _chart(tasks: list, name: str, idle: float) -> Figure:
    p = len({t.device for t in tasks})
    figure = Figure(figsize=(10, 1.4 + 0.45 * p))
    ax = figure.add_subplot()
    sim.plot_gantt(tasks, ax, title=f"{name}: {idle:.1%} of device time idle")
    split = any(t.kind == "W" for t in tasks)
    ax.legend(
        handles=[Patch(color=c) for c in ("tab:blue", "tab:orange", "tab:green")[: 2 + split]],
        labels=["forward", "input gradient B" if split else "backward", "weight gradient W"][
            : 2 + split
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
    )
    figure.tight_layout()
    return figure


def _zero_bubble_view(
    tasks: list, p: int, m: int, ratio: float, name: str, in_flight: Callable
) -> View:
    """ZB-H1's readout: its idle fraction against its closed form and against 1F1B's."""
    idle = sim.idle_fraction(tasks)
    makespan = max(t.end for t in tasks)
    work = sum(t.end - t.start for t in tasks) / p
    half = ratio / 2
    lines = [
        f"{name}; {p} stages, {m} micro-batches, backward = {ratio:g} x forward (B = W = {half:g})",
        f"step: {makespan:g} time units (one unit = one stage's forward of one micro-batch), "
        f"of which each device works {work:g}",
        f"idle (bubble) fraction, simulated:  {idle:.2%}",
    ]
    if m >= p:
        formula = bubbles.zero_bubble_h1_fraction(
            p, m, forward_time=1.0, input_grad_time=half, weight_grad_time=half
        )
        lines.append(f"closed form (p-1)(t_F+t_B-t_W) / (m(t_F+t_B+t_W) + (p-1)(t_F+t_B-t_W)): "
                     f"{formula:.2%}")  # fmt: skip
    else:
        lines.append("closed form: holds for m >= p only (too few micro-batches to defer W into)")
    plain = sim.idle_fraction(sim.simulate("1f1b", p, m, backward_time=ratio))
    lines += [
        f"1F1B on the same pipeline: {plain:.2%} idle; W, which nothing waits for, fills the end",
        "of the step, so the backward wave back to stage 0 carries B alone",
    ]
    held = [sim.max_in_flight(tasks, d) for d in range(p)]
    lines.append(
        "activations in flight (kept until W), per device: " + ", ".join(str(k) for k in held)
    )
    lines.append(
        f"the busiest device holds {max(held)}; 1F1B's stage 0 holds {in_flight('1f1b', p, m, 0)} "
        "(formula for stage 0)"
    )
    if len(tasks) > MAX_DRAWN_TASKS:
        lines.append(
            f"(the chart is drawn up to {MAX_DRAWN_TASKS} tasks; this setting has {len(tasks)}: "
            "fewer stages or micro-batches to see it)"
        )
        return View(lines)
    return View(lines, _chart(tasks, name, idle))


def explorer(
    bubble_fraction_formula: Callable | None = None,
    max_in_flight_formula: Callable | None = None,
) -> Panel:
    """The panel; pass the notebook's own functions (None: the package's)."""
    style = {"description_width": "initial"}
    schedule = widgets.ToggleButtons(
        options=[(label, key) for key, label in SCHEDULE_LABELS.items()],
        value=DEFAULTS["schedule"],
        description="schedule",
        style=style,
    )
    chunks = widgets.BoundedIntText(
        value=DEFAULTS["chunks"],
        min=2,
        max=4,
        description="chunks per device v (interleaved only)",
        disabled=DEFAULTS["schedule"] != "interleaved",
        style=style,
    )

    def enable_chunks(change: dict) -> None:
        chunks.disabled = change["new"] != "interleaved"

    schedule.observe(enable_chunks, names="value")
    controls = {
        "stages": widgets.BoundedIntText(
            value=DEFAULTS["stages"], min=1, max=8, description="stages p", style=style
        ),
        "micro_batches": widgets.BoundedIntText(
            value=DEFAULTS["micro_batches"],
            min=1,
            max=32,
            description="micro-batches m",
            style=style,
        ),
        "schedule": schedule,
        "chunks": chunks,
        "backward_ratio": widgets.Dropdown(
            options=RATIOS,
            value=DEFAULTS["backward_ratio"],
            description="backward / forward time",
            style=style,
        ),
    }
    answers = (
        Answer("bubble_fraction_formula", bubble_fraction_formula, bubbles.bubble_fraction,
               "distopt.costs.bubbles.bubble_fraction"),
        Answer("max_in_flight_formula", max_in_flight_formula, simulated_in_flight,
               "distopt.sim.pipeline.max_in_flight"),
    )  # fmt: skip
    return Panel(
        "pipeline",
        "Pipeline schedules: the bubble and the activations in flight",
        controls,
        lambda s: view(s, bubble_fraction_formula=answers[0], max_in_flight_formula=answers[1]),
        answers=answers,
    )
