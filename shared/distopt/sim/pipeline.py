"""Pipeline-parallel schedules: a simulator and Gantt charts.

A model of ``stages`` devices, each holding consecutive layers, processes a batch split into
``micro_batches``. Every device runs its forward (F) and backward (B) tasks in a fixed order,
the *schedule*; a task starts when the device is free and its input has arrived (the previous
stage's F, or the next stage's B). Communication is taken as instantaneous.

Schedules (Huang et al. 2019, GPipe; Narayanan et al. 2021, Megatron-LM, Section 2.2):

* ``"gpipe"``: all forwards, then all backwards;
* ``"1f1b"``: a few warm-up forwards, then one forward / one backward alternately;
* ``"interleaved"``: 1F1B where each device holds ``interleave`` non-consecutive chunks of
  layers (device d holds virtual stages d, d + stages, ...); each task is ``interleave`` times
  shorter;
* ``"zb-h1"``: ZB-H1 of Qi et al. 2023 (Zero Bubble Pipeline Parallelism): 1F1B with each
  backward split into B, the gradient of the stage's input (which the previous stage waits
  for), and W, the gradient of its weights (which nobody waits for); device d keeps up to d
  W tasks pending, so they fill the end of the step. With t_W <= t_B and m >= p its idle time
  is (p - 1)(t_F + t_B - t_W), :func:`distopt.costs.bubbles.zero_bubble_h1_fraction`.

With forward and backward times t_f and t_b per micro-batch and stage, the idle time of each
device is (stages - 1)(t_f + t_b) / interleave, and the ideal time is micro_batches (t_f + t_b):
the closed forms are in :mod:`distopt.costs.bubbles`, and the simulated schedules reproduce them.
The real engine (``torch.distributed.pipelining``) runs in
:mod:`distopt.ranks.model_parallel_ranks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from distopt.costs.bubbles import check_shape

__all__ = [
    "SCHEDULES",
    "Task",
    "idle_fraction",
    "max_in_flight",
    "plot_gantt",
    "schedule_order",
    "simulate",
]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Task:
    """One forward or backward pass of one micro-batch through one chunk of layers."""

    device: int  # pipeline rank that runs it
    kind: str  # "F", "B" or (ZB-H1) "W"
    micro_batch: int
    chunk: int  # which of the device's model chunks (0 unless interleaved)
    start: float  # time units
    end: float


def schedule_order(
    schedule: str, stages: int, micro_batches: int, *, interleave: int = 1
) -> list[list[tuple[str, int, int]]]:
    """For each device, its tasks in execution order, as (kind, micro_batch, chunk) tuples.

    The interleaved order is Megatron-LM's: micro-batches go through a device's chunks in
    groups of ``stages``, so ``micro_batches`` must be a multiple of ``stages``. ZB-H1's is
    1F1B's with a W task after B tasks, device d keeping up to d of them pending.
    """
    check_shape(stages, micro_batches, interleave)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule != "interleaved" and interleave != 1:
        raise ValueError(f"interleave > 1 needs schedule='interleaved', got {schedule!r}")
    p, m, v = stages, micro_batches, interleave
    if schedule == "zb-h1":
        orders = []
        for device, plain in enumerate(schedule_order("1f1b", p, m)):
            order, pending = [], []
            for kind, mb, chunk in plain:
                order.append((kind, mb, chunk))
                if kind == "B":
                    pending.append(mb)
                    while len(pending) > device:  # device d defers up to d weight gradients
                        order.append(("W", pending.pop(0), 0))
            orders.append(order + [("W", mb, 0) for mb in pending])
        return orders
    orders = []
    for device in range(p):
        if schedule == "gpipe":
            order = [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]
            orders.append(order)
            continue
        if schedule == "1f1b":
            forwards = [("F", mb, 0) for mb in range(m)]
            backwards = [("B", mb, 0) for mb in range(m)]
            warmup = min(p - device - 1, m)
        else:
            if m % p:
                raise ValueError(f"interleaved needs micro_batches divisible by stages ({m}, {p})")

            def task(kind: str, k: int) -> tuple[str, int, int]:
                chunk = (k // p) % v
                if kind == "B":
                    chunk = v - 1 - chunk
                return (kind, (k // (p * v)) * p + k % p, chunk)

            forwards = [task("F", k) for k in range(m * v)]
            backwards = [task("B", k) for k in range(m * v)]
            warmup = m * v if m == p else min((p - device - 1) * 2 + (v - 1) * p, m * v)
        order = forwards[:warmup]
        for k in range(len(forwards) - warmup):
            order += [forwards[warmup + k], backwards[k]]
        order += backwards[len(forwards) - warmup :]
        orders.append(order)
    return orders


def simulate(
    schedule: str,
    stages: int,
    micro_batches: int,
    *,
    interleave: int = 1,
    forward_time: float = 1.0,
    backward_time: float = 2.0,
    weight_time: float | None = None,
) -> list[Task]:
    """Run a schedule and return every task with its start and end time.

    ``forward_time`` and ``backward_time`` are per micro-batch and per stage (all of a
    device's layers); a chunk of an interleaved device takes 1/``interleave`` of them. Under
    ``"zb-h1"`` the backward is split: W takes ``weight_time`` (default half the backward)
    and B the rest.
    """
    orders = schedule_order(schedule, stages, micro_batches, interleave=interleave)
    p, v = stages, interleave
    duration = {"F": forward_time / v, "B": backward_time / v}
    if schedule == "zb-h1":
        weight = backward_time / 2 if weight_time is None else weight_time
        if not 0 <= weight <= backward_time:
            raise ValueError(f"weight_time must lie in [0, backward_time], got {weight}")
        duration.update(B=backward_time - weight, W=weight)
    elif weight_time is not None:
        raise ValueError("weight_time splits the backward of schedule='zb-h1' only")
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro_batch, virtual stage) -> end
    free = [0.0] * p
    position = [0] * p
    tasks: list[Task] = []
    last = p * v - 1
    while any(position[d] < len(orders[d]) for d in range(p)):
        progressed = False
        for device in range(p):
            if position[device] == len(orders[device]):
                continue
            kind, mb, chunk = orders[device][position[device]]
            virtual = chunk * p + device
            if kind == "F":
                needs = [("F", mb, virtual - 1)] if virtual > 0 else []
            elif kind == "W":  # the weight gradient needs the stage's own input gradient pass
                needs = [("B", mb, virtual)]
            else:
                needs = [("F", mb, virtual)]
                needs += [("B", mb, virtual + 1)] if virtual < last else []
            if any(need not in done for need in needs):
                continue
            start = max([free[device]] + [done[need] for need in needs])
            end = start + duration[kind]
            done[(kind, mb, virtual)] = end
            free[device] = end
            position[device] += 1
            tasks.append(Task(device, kind, mb, chunk, start, end))
            progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule!r} deadlocks")
    return tasks


def idle_fraction(tasks: Sequence[Task]) -> float:
    """Fraction of device-time spent idle between time 0 and the last task's end."""
    devices = {t.device for t in tasks}
    makespan = max(t.end for t in tasks)
    busy = sum(t.end - t.start for t in tasks)
    return 1 - busy / (len(devices) * makespan)


def max_in_flight(tasks: Iterable[Task], device: int) -> int:
    """Most micro-batch chunks whose forward has ended and backward not yet, on ``device``.

    Each such micro-batch keeps its activations in memory: this is the activation memory of
    the device in units of one micro-batch's activations of one chunk. Under ZB-H1 they are
    kept until the W task (the weight gradient needs the layers' inputs).
    """
    mine = [t for t in tasks if t.device == device]
    freed_by = "W" if any(t.kind == "W" for t in mine) else "B"
    events = sorted(
        ((t.end, 1 if t.kind == "F" else -1) for t in mine if t.kind in ("F", freed_by)),
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def plot_gantt(tasks: Sequence[Task], ax, *, title: str = "") -> None:
    """Draw tasks as bars, one row per device; forwards blue, backwards orange (ZB-H1's weight
    gradients green), labelled with their micro-batch, counted from 0."""
    colors = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}
    for t in tasks:
        color = colors[t.kind]
        shade = 1.0 if t.chunk % 2 == 0 else 0.55
        ax.barh(
            t.device,
            t.end - t.start,
            left=t.start,
            color=color,
            alpha=shade,
            edgecolor="black",
            linewidth=0.5,
        )
        ax.text(
            (t.start + t.end) / 2,
            t.device,
            str(t.micro_batch),  # 0-based, as in the code and the text
            ha="center",
            va="center",
            fontsize=7,
        )
    devices = sorted({t.device for t in tasks})
    ax.set_yticks(devices, [f"device {d}" for d in devices])
    ax.invert_yaxis()
    ax.set(xlabel="time (units of one stage's forward pass)", title=title)
