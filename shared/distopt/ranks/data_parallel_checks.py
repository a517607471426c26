"""Checks of data-parallel rank code a student writes: run it for real, compare, say what
differed.

The test cells of sections 01 and 02 run the student's function on ``problem.world_size``
ranks with ``distopt.launch``, record what each rank sent and what it carried
(``distopt.engine.record``), and compare with the single-process baseline of
:class:`ShardedProblem`: the weights every rank ends with, and the contents of the messages
(each rank's all-reduce inputs are its own shard's gradient; ZeRO-1's all-gathered slice is
the rank's updated weights and its moments are Adam's for its slice). A rank never receives
the problem: each gets its own part, built in the launching process
(:meth:`ShardedProblem.own_part`: its rows, its starting weights, the settings, no seed), so
nothing it holds can answer for another rank. Every failure says what was compared, the
numbers, and a hint; nothing here solves an exercise.

On the emulated link (:mod:`distopt.engine.link`), :func:`run_on_link` gives each rank's
transfers and backward passes too, and :func:`assert_overlapped_timeline` checks the
timeline of a bucketed run against the overlap simulator of section 01.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from distopt.engine import link, record
from distopt.engine.record import Recording
from distopt.problems.shards import ShardedProblem, flat, max_abs_diff, param_bytes
from distopt.sim import overlap

__all__ = [
    "assert_overlapped_timeline",
    "assert_own_shares_sent",
    "assert_weights_match",
    "assert_zero1_state",
    "linear_layer_bytes",
    "modelled_exposed_s",
    "param_bytes_of",
    "run_on_link",
    "run_traced",
    "weights_of",
]


def run_traced(
    fn: Callable[..., Any], problem: ShardedProblem, *args: Any, timeout: float = 60
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, part, *args)`` on the problem's ranks, ``part`` the rank's own
    (:meth:`ShardedProblem.own_part`, a :class:`~distopt.problems.shards.RankShard`: its rows
    and its starting weights, no seed): (value, recording) each,
    the recordings with what every call carried (for the checks of message contents) and,
    as ``recording.forwards``, the examples each forward pass of the model's first layer
    took (:class:`_Forwards`)."""
    first = (problem.layer_sizes[0], problem.layer_sizes[1])
    # the problem is not shipped: each rank gets its own part (record.run_traced)
    results = record.run_traced(
        _Forwards(fn, first), problem, *args, timeout=timeout, payloads=True
    )
    found = []
    for (value, forwards), log in results:
        log.forwards = forwards  # type: ignore[attr-defined]
        found.append((value, log))
    return found


class _Forwards:
    """``fn`` run under a global forward pre-hook (``register_module_forward_pre_hook``, which
    the rank code's own module hooks cannot shadow) that notes, for every forward pass of an
    ``nn.Linear`` shaped like the model's first layer, the sum of each row of its input:
    which examples went through the model, in which passes. Returns (value, [row sums])."""

    def __init__(self, fn: Callable[..., Any], first: tuple[int, int]) -> None:
        self.fn = fn
        self.first = first

    def __call__(self, rank: int, world_size: int, *args: Any) -> tuple[Any, list[torch.Tensor]]:
        seen: list[torch.Tensor] = []
        first = self.first

        def note(module: torch.nn.Module, inputs: tuple) -> None:
            if (
                isinstance(module, torch.nn.Linear)
                and (module.in_features, module.out_features) == first
                and inputs
                and torch.is_tensor(inputs[0])
            ):
                x = inputs[0].detach().to(torch.float64)
                seen.append(x.reshape(-1, x.shape[-1]).sum(dim=1).clone())

        handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
        try:
            value = self.fn(rank, world_size, *args)
        finally:
            handle.remove()
        return value, seen


def weights_of(value: Any) -> list:
    """The parameter list a rank returned (alone, or first of a tuple)."""
    return list(value[0] if isinstance(value, tuple) else value)


def assert_weights_match(
    results: list[tuple[Any, Recording]],
    reference: list,
    *,
    what: str,
    tolerance: float = 1e-10,
    hint: str = "",
) -> None:
    """Every rank's returned weights equal ``reference`` within ``tolerance``."""
    for rank, (value, _) in enumerate(results):
        diff = max_abs_diff(weights_of(value), reference)
        assert diff <= tolerance, (
            f"rank {rank} of {len(results)}: its weights differ from {what} by {diff:.2e} "
            f"(tolerance {tolerance:g}). {hint}"
        )


def param_bytes_of(problem: ShardedProblem) -> int:
    """Bytes of all the model's parameters (float64)."""
    return sum(param_bytes(problem.new_model(0)))


def _carried(log: Recording, name: str) -> torch.Tensor:
    """Everything this rank handed to the calls ``name``, flattened and concatenated."""
    pieces = [t.reshape(-1).to(torch.float64) for call in log.of(name) for t in call.payload]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.float64)


def assert_own_shares_sent(
    results: list[tuple[Any, Recording]],
    problem: ShardedProblem,
    *,
    name: str = "all_reduce",
    tolerance: float = 1e-9,
) -> None:
    """What each rank handed to its ``name`` calls was its own shard's gradient, step by
    step, and (with micro-batches) it came from forward passes of its micro-batches.

    The numbers a rank all-reduced, cut in call order into one gradient's worth a step, must
    be at each step t, as a collection (in any order of parameters and buckets), its share
    of step t's gradient (:meth:`ShardedProblem.reference_shares`) times one positive
    factor of the rank's choice, the same at every step (sum or mean over its shard, divided
    before or after): not the whole batch's gradient divided by N, which a rank that trained
    on every shard would send, nor zeros or another step's gradient.

    With ``problem.micro_batches`` m > 1, every forward pass of the model (seen by
    :func:`run_traced`) must take one of the rank's micro-batches
    (``problem.micro_batch(step, rank, k)``), and every micro-batch must go through it.
    """
    shares = problem.reference_shares()
    for rank, (_, log) in enumerate(results):
        sent = _carried(log, name)
        own = shares[:, rank]
        num_p = own.shape[1]
        assert len(sent) == own.numel(), (
            f"rank {rank} of {len(results)} handed {len(sent)} numbers to {name} in "
            f"{problem.steps} steps; expected its gradient once a step, {problem.steps} x "
            f"{num_p}. {log.summary()}"
        )
        factors = [_factor(sent[t * num_p : (t + 1) * num_p], own[t], tolerance)
                   for t in range(problem.steps)]  # fmt: skip
        if all(f is not None for f in factors) and _same_factor(factors, tolerance):
            if problem.micro_batches > 1:
                _assert_micro_batch_forwards(rank, log, problem)
            continue
        whole = shares.sum(dim=1)
        bad = next(t for t, f in enumerate(factors) if f is None) if None in factors else None
        named = (
            " They are the whole global batch's gradient (scaled): each rank must compute the "
            "gradient of its own shard only, and the all-reduce adds the shards' gradients."
            if all(
                _factor(sent[t * num_p : (t + 1) * num_p], whole[t], tolerance) is not None
                for t in range(problem.steps)
            )
            else ""
        )
        where = (
            f" At step {bad}, the {num_p} numbers it handed over (calls in order, {num_p} a "
            f"step) are not proportional to that step's gradient of its shard."
            if bad is not None
            else " Each step's numbers are its gradient times a different factor: the same "
            "scaling every step, please."
        )
        raise AssertionError(
            f"rank {rank} of {len(results)}: what it handed to {name} is not its own shard's "
            f"gradient (the gradient of problem.batch(step, {rank})'s loss at each step's "
            f"weights, up to one constant factor).{where}{named}"
        )


def _assert_micro_batch_forwards(rank: int, log: Recording, problem: ShardedProblem) -> None:
    """Every forward pass of the model took one of this rank's micro-batches, and every
    micro-batch of every step went through it (a pass repeated, to print a loss, is fine)."""
    m = problem.micro_batches
    forwards = list(getattr(log, "forwards", []))
    micro = {(step, k): problem.micro_batch(step, rank, k)[0].sum(dim=1)
             for step in range(problem.steps) for k in range(m)}  # fmt: skip
    sizes = [len(micro[0, k]) for k in range(m)]
    seen = set()
    for index, rows in enumerate(forwards):
        match = next(
            (key for key, want in micro.items()
             if want.shape == rows.shape and torch.allclose(rows, want, rtol=0, atol=1e-12)),
            None,
        )  # fmt: skip
        assert match is not None, (
            f"rank {rank}: forward pass {index + 1} of the model's first layer took "
            f"{len(rows)} examples that are not one of its micro-batches ({sizes} examples a "
            "step, problem.micro_batch(step, rank, k) for k in range(micro_batches)). Each "
            "micro-batch goes through the model on its own, forward and backward."
        )
        seen.add(match)
    missing = sorted(set(micro) - seen)
    assert not missing, (
        f"rank {rank}: {len(missing)} of its {len(micro)} micro-batches (step, k) never went "
        f"through the model, e.g. {missing[:3]}; it ran {len(forwards)} forward passes in "
        f"{problem.steps} steps. Run every micro-batch through the model, forward and backward."
    )


def _factor(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> float | None:
    """c with ``got`` = c * ``want`` as collections (sorted; c may be negative), or None."""
    for sign in (1.0, -1.0):  # a rank may send the negated gradient, c < 0
        a, b = torch.sort(sign * got).values, torch.sort(want).values
        norm = float(b @ b)
        if norm == 0.0:
            if not a.numel() or float(a.abs().max()) <= tolerance:
                return sign
            continue
        c = float(a @ b) / norm
        if c > 0 and float((a - c * b).abs().max()) <= tolerance * max(1.0, float(a.abs().max())):
            return sign * c
    return None


def _same_factor(factors: list, tolerance: float) -> bool:
    first = factors[0]
    return all(abs(f - first) <= 1e-6 * abs(first) for f in factors)


def assert_zero1_state(
    results: list[tuple[Any, Recording]], problem: ShardedProblem, *, tolerance: float = 1e-10
) -> None:
    """ZeRO-1 Adam: at every step each rank reduce-scattered its own shard's gradient (on
    single-process Adam's trajectory) and all-gathered its slice of the updated weights,
    and its returned moments are single-process Adam's for its slice.

    The slices are the even split of the padded flat parameter vector, ceil(P / N) numbers
    each, rank r's starting at r * ceil(P / N); padding is zero. What a rank hands to the
    reduce-scatter of step t is the padded flat gradient of its own examples at the weights
    Adam had before step t (:meth:`ShardedProblem.reference_adam_shares`), in parameter
    order, times one positive factor the same at every step.
    """
    states = problem.reference_adam_states()
    shares = problem.reference_adam_shares()
    n, num_p = problem.world_size, len(states[0]["weights"])
    shard = -(-num_p // n)

    def padded_of(vector: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(shard * n, dtype=torch.float64)
        padded[:num_p] = vector
        return padded

    def slice_of(vector: torch.Tensor, rank: int) -> torch.Tensor:
        return padded_of(vector)[rank * shard : (rank + 1) * shard]

    for rank, (_, log) in enumerate(results):
        scattered = [flat(list(call.payload)) for call in log.of("reduce_scatter_tensor")]
        assert len(scattered) == problem.steps, (
            f"rank {rank} of {n} made {len(scattered)} reduce_scatter_tensor calls in "
            f"{problem.steps} steps; expected one a step. {log.summary()}"
        )
        factor = None
        for step, sent in enumerate(scattered):
            want = padded_of(shares[step, rank])
            c = float(sent @ want) / float(want @ want) if sent.shape == want.shape else 0.0
            diff = float((sent - c * want).abs().max()) if sent.shape == want.shape else math.inf
            factor = c if factor is None else factor
            right = (
                c > 0
                and diff <= tolerance * max(1.0, float(sent.abs().max()))
                and abs(c - factor) <= 1e-6 * factor
            )
            assert right, (
                f"rank {rank} of {n}, step {step + 1}: the {sent.numel()} numbers it handed to "
                "reduce_scatter_tensor are not the padded flat gradient of its own examples "
                f"(problem.batch({step}, {rank})) at the step's weights, in parameter order, "
                f"times the factor of its first step (best factor {c:.3g}, left over "
                f"{diff:.2e}). Each rank reduce-scatters the gradient of its own shard; the "
                "collective adds the ranks' and leaves each its slice."
            )

    for rank, (value, log) in enumerate(results):
        gathered = [flat(list(call.payload)) for call in log.of("all_gather_into_tensor")]
        assert len(gathered) == problem.steps, (
            f"rank {rank} of {n} made {len(gathered)} all_gather_into_tensor calls in "
            f"{problem.steps} steps; expected one a step. {log.summary()}"
        )
        for step, (sent, state) in enumerate(zip(gathered, states, strict=True), start=1):
            want = slice_of(state["weights"], rank)
            diff = float((sent - want).abs().max()) if sent.shape == want.shape else float("inf")
            assert diff <= tolerance, (
                f"rank {rank} of {n}, step {step}: it all-gathered {sent.numel()} numbers that "
                f"differ from its slice of the updated weights (numbers {rank * shard} to "
                f"{(rank + 1) * shard - 1} of the flat parameters) by {diff:.2e}. Each rank "
                "updates its own slice with its own moments and all-gathers the new weights "
                "(not gradients) so that every rank holds the whole model again."
            )
        moments = value[1] if isinstance(value, tuple) and len(value) > 1 else []
        assert len(moments) == 2, (
            f"rank {rank} of {n} returned {len(moments)} moment tensors; expected two, the "
            "first and second moment of its slice"
        )
        for name, what, got in zip(
            ("exp_avg", "exp_avg_sq"), ("first", "second"), moments, strict=True
        ):
            want = slice_of(states[-1][name], rank)
            got = torch.as_tensor(got, dtype=torch.float64).reshape(-1)
            diff = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
            assert diff <= tolerance * max(1.0, float(want.abs().max())), (
                f"rank {rank} of {n}: its {what} moment after {problem.steps} steps differs "
                f"from torch.optim.Adam's for its slice by {diff:.2e}. The moments are "
                "updated from the reduce-scattered gradient slice (the sum of the shards' "
                "gradients for those numbers), with Adam's betas 0.9 and 0.999."
            )


def run_on_link(
    fn: Callable[..., Any],
    problem: ShardedProblem,
    *args: Any,
    latency_s: float,
    bandwidth_bytes_per_s: float,
    time_scale: float,
    timeout: float = 60,
) -> list[tuple[Any, Recording, link.Link]]:
    """``fn(rank, world_size, part, *args)`` on the problem's ranks (each its own part, as in
    :func:`run_traced`), each on an emulated
    link of the stated latency and bandwidth, under the recorder: (value, recording, link)."""
    linked = link.linked(
        fn, latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s, time_scale=time_scale
    )
    results = record.run_traced(linked, problem, *args, timeout=timeout)
    return [(value, log, wire) for (value, wire), log in results]


def linear_layer_bytes(problem: ShardedProblem) -> list[int]:
    """Gradient bytes of each nn.Linear of the problem's model (weight and bias), in order."""
    layers = [m for m in problem.new_model(0) if isinstance(m, torch.nn.Linear)]
    return [sum(param_bytes(layer)) for layer in layers]


def modelled_exposed_s(problem: ShardedProblem, bucket_bytes: float, wire: link.Link) -> float:
    """The overlap simulator's exposed communication for one step of a bucketed run of
    ``problem`` on ``wire``'s network, in wall seconds: each layer's backward takes its
    emulated compute (``problem.layer_backward_s``), the all-reduces the link's times."""
    layer_bytes = linear_layer_bytes(problem)
    backward_s = [problem.layer_backward_s] * len(layer_bytes)
    timeline = overlap.simulate_backward(
        backward_s,
        layer_bytes,
        bucket_bytes=bucket_bytes,
        world_size=problem.world_size,
        bandwidth=wire.bandwidth_bytes_per_s / wire.time_scale,
        latency=wire.latency_s * wire.time_scale,
        algorithm=wire.algorithm,
    )
    return timeline.end_s - sum(backward_s)


# The band of the exposed communication, as a fraction of the simulator's (median over the
# steps and ranks of a run). The figure is read on the emulation's clock (see
# assert_overlapped_timeline), so the machine's load does not move it: the reference answer
# gives 1.00 (the last bucket's modelled all-reduce) idle and beside 8 CPU hogs on 2 cores.
EXPOSED_BAND = (0.6, 1.3)


def assert_overlapped_timeline(
    results: list[tuple[Any, Recording, link.Link]],
    problem: ShardedProblem,
    bucket_bytes: float,
    *,
    band: tuple[float, float] = EXPOSED_BAND,
) -> list[list[float]]:
    """A bucketed run on the emulated link overlaps as the simulator says it should.

    For every rank and step (the all-reduces issued from the step's backward pass until the
    next one's): one all-reduce per bucket of ``overlap.assign_buckets``, each handed over
    while the backward pass still had the earlier layers to do (at least 90 % of their
    emulated compute, ``problem.layer_backward_s`` each, was still ahead). Over all steps and
    ranks, the median exposed communication (the time from the backward pass's end to the
    end of the step's last all-reduce) within ``band`` times the simulator's
    (:func:`modelled_exposed_s`). Returns each rank's exposed seconds per step.

    Every figure is read on the emulation's own clock, so that a busy machine moves none of
    them: the link's modelled start and end of each transfer (they follow from the issue
    times alone), and the backward pass's end taken as the moment its last gradient was
    ready, which is when the last bucket was handed over (its hook runs then) if that came
    before the recorded return of ``backward()``: the wall time from the last hook to that
    return is scheduling, not compute. A backward pass that waits for an all-reduce is caught
    without a clock: the link records when each result was handed back (``waited_s``), and
    none may be before the backward pass returned.
    """
    layer_bytes = linear_layer_bytes(problem)
    plan = overlap.assign_buckets(layer_bytes, bucket_bytes)
    found, exposed = [], []
    for rank, (_, log, wire) in enumerate(results):
        transfers = wire.of("all_reduce")
        assert len(log.backward) == problem.steps, (
            f"rank {rank} ran {len(log.backward)} backward passes; expected one per step, "
            f"{problem.steps}"
        )
        steps = []
        for step, (begin, end) in enumerate(log.backward):
            until = log.backward[step + 1][0] if step + 1 < len(log.backward) else float("inf")
            mine = [t for t in transfers if begin <= t.issued_s < until]
            assert len(mine) == len(plan), (
                f"rank {rank}, step {step}: {len(mine)} all-reduces; expected one per bucket, "
                f"{len(plan)} (buckets {plan}, layers last first)"
            )
            later = len(layer_bytes)  # layers whose backward is still to run
            for index, (bucket, transfer) in enumerate(zip(plan, mine, strict=True)):
                later -= len(bucket)
                ahead_s, left_s = end - transfer.issued_s, later * problem.layer_backward_s
                assert ahead_s >= 0.9 * left_s, (
                    f"rank {rank}, step {step}: bucket {index} (layers {bucket}) was handed to "
                    f"the all-reduce {ahead_s * 1e3:.2f} ms before the backward pass ended, but "
                    f"the {later} earlier layer(s) still had {left_s * 1e3:.2f} ms of compute "
                    "to do: start each bucket from a gradient hook as it fills"
                )
            held = [
                (index, t.waited_s)
                for index, t in enumerate(mine)
                if getattr(t, "waited_s", None) is not None and t.waited_s < end
            ]
            assert not held, (
                f"rank {rank}, step {step}: the backward pass had the result of the "
                f"all-reduce of bucket(s) {[index for index, _ in held]} back "
                f"{', '.join(f'{(end - when) * 1e3:.2f}' for _, when in held)} ms before it "
                "ended: it waited for them, so nothing overlapped. Is there a wait inside a "
                "hook (work.wait(), or an all-reduce without async_op=True)? Wait for the "
                "buckets after backward() returns"
            )
            # the backward's compute ended when its last gradient was ready: at the latest,
            # when the last bucket was handed over from its hook
            ready = min(end, max(t.issued_s for t in mine))
            steps.append(max(0.0, max(t.end_s for t in mine) - ready))
            exposed.append(steps[-1])
        found.append(steps)
    model_s = modelled_exposed_s(problem, bucket_bytes, results[0][2])
    median_s = float(np.median(exposed))
    low, high = band
    assert low * model_s <= median_s <= high * model_s, (
        f"the all-reduces ran a median {median_s * 1e3:.2f} ms after the backward pass ended "
        f"(its last gradient ready, on the link's modelled clock; steps and ranks: "
        f"{', '.join(f'{e * 1e3:.2f}' for e in exposed)} ms); the overlap simulator gives "
        f"{model_s * 1e3:.2f} ms for these buckets, layers and network (band "
        f"{low:g}x to {high:g}x). Less: did the backward pass wait for an all-reduce (a wait "
        "inside a hook)? More: were buckets held back until the backward pass ended?"
    )
    return found
