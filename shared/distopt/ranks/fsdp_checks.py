"""Checks of a student's ZeRO-3 / FSDP rank code (section 02, exercise 9): run it on an
:class:`~distopt.ranks.fsdp_ranks.FsdpBench`, compare with one process, inspect every message
and the full weights it held.

What a right answer does, step by step, on every rank (the layout of a layer is
:mod:`distopt.ranks.fsdp_ranks`'s: weight then bias, flat, padded to N * S):

* forward, layers 0 to L-1: all-gather the layer from the shards
  (``all_gather_into_tensor``, this rank's S numbers in), compute it, drop the full weights;
* backward, layers L-1 to 0: all-gather the layer again, compute its gradient, and
  ``reduce_scatter_tensor`` the padded full gradient (N * S numbers in), which leaves this
  rank the sum over ranks of its own slice;
* an SGD step on the shards.

So per step a rank hands over S numbers twice and N * S once per layer, and sends
3 (N - 1) / N times the padded parameter bytes on a ring; the gathers carry its slice of the
current weights, the reduce-scatters its own shard's gradient; one layer's full weights are
alive at a time. Every failure says what was compared and hints at the concept; nothing here
solves the exercise.
"""

from __future__ import annotations

import torch

from distopt.engine.record import same_call
from distopt.problems.shards import flat
from distopt.ranks.fsdp_ranks import BenchRun, FsdpBench

__all__ = [
    "assert_messages_carry",
    "assert_one_layer_at_a_time",
    "assert_shards_match",
    "assert_traffic",
    "expected_calls",
    "ring_bytes_sent",
]

GATHER, SCATTER = "all_gather_into_tensor", "reduce_scatter_tensor"
# Calls that move data; a barrier does not count.
_MOVING = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        GATHER,
        "reduce_scatter",
        SCATTER,
        "all_to_all",
        "all_to_all_single",
        "gather",
        "scatter",
        "send",
        "recv",
        "isend",
        "irecv",
    }
)


def expected_calls(bench: FsdpBench) -> list[tuple[str, int, int]]:
    """One step's collectives in order: (name, layer, bytes handed over)."""
    layers = range(bench.num_layers)
    shard_bytes = [8 * bench.shard_numel(i) for i in layers]
    calls = [(GATHER, i, shard_bytes[i]) for i in layers]
    for i in reversed(layers):
        calls += [(GATHER, i, shard_bytes[i]), (SCATTER, i, bench.world_size * shard_bytes[i])]
    return calls


def ring_bytes_sent(run: BenchRun, world_size: int) -> float:
    """Bytes this rank sends on a ring for its all-gathers and reduce-scatters: (N - 1) times
    each gathered shard, (N - 1) / N of each reduce-scattered vector."""
    n = world_size
    return (n - 1) * run.log.payload_bytes(GATHER) + (n - 1) / n * run.log.payload_bytes(SCATTER)


def assert_shards_match(
    runs: list[BenchRun], bench: FsdpBench, *, tolerance: float = 1e-10
) -> None:
    """Each rank returned its S numbers of every layer, and together they are single-process
    SGD's weights (``problem.reference_sgd()``), padding zero."""
    n, steps = bench.world_size, bench.problem.steps
    reference = bench.layer_vectors(bench.problem.reference_sgd())
    for rank, run in enumerate(runs):
        shards = list(run.value) if isinstance(run.value, list | tuple) else []
        assert len(shards) == bench.num_layers, (
            f"rank {rank} of {n} returned {len(shards)} tensors; expected its shard of each of "
            f"the {bench.num_layers} layers, in order"
        )
        for layer, shard in enumerate(shards):
            size = bench.shard_numel(layer)
            assert torch.as_tensor(shard).numel() == size, (
                f"rank {rank} of {n}, layer {layer}: returned {torch.as_tensor(shard).numel()} "
                f"numbers; a rank keeps only its slice, ceil({bench.layer_numel(layer)}/{n}) = "
                f"{size} (not the full layer)"
            )
    for layer in range(bench.num_layers):
        size = bench.shard_numel(layer)
        want = bench.padded(layer, reference[layer])
        for rank, run in enumerate(runs):
            got = torch.as_tensor(run.value[layer], dtype=torch.float64).reshape(-1)
            diff = float((got - want[rank * size : (rank + 1) * size]).abs().max())
            assert diff <= tolerance, (
                f"rank {rank} of {n}, layer {layer}: after {steps} steps its shard differs from "
                f"single-process SGD's numbers {rank * size} to {(rank + 1) * size - 1} of the "
                f"layer by {diff:.2e} (tolerance {tolerance:g}). The reduce-scatter must leave "
                "each rank the sum of the ranks' gradients for its slice: each rank's loss is "
                "its share of the global mean (loss_sum / global_batch), summed, not averaged "
                "again."
            )


def assert_traffic(runs: list[BenchRun], bench: FsdpBench) -> None:
    """Per step, per layer: two all-gathers of the shard and one reduce-scatter of the padded
    gradient, in forward-then-backward order, all into the bench's buffers; nothing else.
    On a ring that is 3 (N - 1) / N times the padded parameter bytes per step."""
    n, steps = bench.world_size, bench.problem.steps
    want = expected_calls(bench) * steps
    per_step = len(want) // steps
    for rank, run in enumerate(runs):
        # torch 2.13's all_gather_single / reduce_scatter_single count as the old names
        got = [(same_call(c.name), c.payload_bytes) for c in run.log.calls]
        got = [(name, size) for name, size in got if name in _MOVING]
        reduced = run.log.payload_bytes("all_reduce")
        assert not reduced, (
            f"rank {rank} of {n} all-reduced {reduced:,} bytes. ZeRO-3 reduce-scatters each "
            "layer's gradient (reduce_scatter_tensor): a rank receives the sum of its own slice "
            "only, (N-1)/N of the layer's bytes on a ring instead of 2(N-1)/N. "
            f"{run.log.summary()}"
        )
        gathers = sum(1 for name, _ in got if name == GATHER)
        if gathers == bench.num_layers * steps:
            raise AssertionError(
                f"rank {rank} of {n} all-gathered each layer once per step ({gathers} gathers "
                f"in {steps} steps). ZeRO-3 frees a layer's full weights after its forward and "
                "gathers them again for its backward: two gathers per layer and step, so that "
                f"only one layer is ever whole. {run.log.summary()}"
            )
        for index, (call, expected) in enumerate(zip(got, want, strict=False)):
            name, layer, size = expected
            if call != (name, size):
                step, position = divmod(index, per_step)
                phase = "forward" if position < bench.num_layers else "backward"
                raise AssertionError(
                    f"rank {rank} of {n}, step {step}: call {position + 1} of the step was "
                    f"{call[0]} of {call[1]:,} bytes; expected {name} of {size:,} bytes "
                    f"(layer {layer}, {phase}). Per step: gather layers 0..L-1 for the "
                    "forward; then from the last layer down, gather it again and "
                    "reduce-scatter its padded gradient. A gather hands over this rank's "
                    "shard (S numbers), a reduce-scatter the padded full gradient (N*S). "
                    f"{run.log.summary()}"
                )
        assert len(got) == len(want), (
            f"rank {rank} of {n} made {len(got)} data-moving calls in {steps} steps; expected "
            f"{len(want)} ({per_step} a step: 2 all-gathers and 1 reduce-scatter per layer). "
            f"{run.log.summary()}"
        )
        assert run.gathers_elsewhere == 0, (
            f"rank {rank} of {n}: {run.gathers_elsewhere} all-gathers wrote into a tensor the "
            "bench did not hand out. Gather each layer into bench.full_buffer(layer), so that "
            "the bench can count the full weights alive."
        )
        sent = ring_bytes_sent(run, n)
        formula = steps * 3 * (n - 1) / n * bench.padded_param_bytes()
        assert abs(sent - formula) <= 1e-9 * formula, (
            f"rank {rank} of {n} sent {sent:,.0f} bytes on a ring in {steps} steps; ZeRO-3 "
            f"sends 3(N-1)/N x {bench.padded_param_bytes():,} padded parameter bytes per step "
            f"= {formula:,.0f}"
        )


def _trajectory(bench: FsdpBench) -> list[list[torch.Tensor]]:
    """Each layer's padded flat weights at the start of each step of single-process SGD."""
    problem = bench.problem
    shares = problem.reference_shares()  # (steps, N, P): each rank's share of the gradient
    weights = flat(list(problem.new_model(0).parameters())).detach()
    found = []
    for step in range(problem.steps):
        found.append(_split_padded(bench, weights))
        weights = weights - problem.lr * shares[step].sum(dim=0)
    return found


def _split_padded(bench: FsdpBench, vector: torch.Tensor) -> list[torch.Tensor]:
    """A flat vector of all P parameters cut into the layers', each padded to N * S."""
    sizes = [bench.layer_numel(i) for i in range(bench.num_layers)]
    return [bench.padded(i, piece) for i, piece in enumerate(torch.split(vector, sizes))]


def assert_messages_carry(
    runs: list[BenchRun], bench: FsdpBench, *, tolerance: float = 1e-10
) -> None:
    """Both gathers of a layer carry this rank's slice of the layer's current weights; its
    reduce-scatter carries this rank's own shard's gradient of the layer (one positive
    factor per rank: a sum or a mean, as long as the weights come out right)."""
    n = bench.world_size
    weights = _trajectory(bench)
    shares = bench.problem.reference_shares()
    order = expected_calls(bench)
    for rank, run in enumerate(runs):
        calls = [c for c in run.log.calls if same_call(c.name) in (GATHER, SCATTER)]
        sent_grads, own_grads = [], []
        for index, call in enumerate(calls):
            step, position = divmod(index, len(order))
            name, layer, _ = order[position]
            size = bench.shard_numel(layer)
            carried = flat(list(call.payload))
            if name == GATHER:
                want = weights[step][layer][rank * size : (rank + 1) * size]
                diff = float((carried - want).abs().max())
                assert diff <= tolerance, (
                    f"rank {rank} of {n}, step {step}, layer {layer}: what it all-gathered "
                    f"({'forward' if position < bench.num_layers else 'backward'}) differs "
                    f"from its slice of the current weights (numbers {rank * size} to "
                    f"{(rank + 1) * size - 1} of the layer) by {diff:.2e}. Each rank hands "
                    "the gather its own shard of the weights; the gather returns the layer."
                )
            else:
                sent_grads.append(carried)
                own_grads.append(_split_padded(bench, shares[step, rank])[layer])
        assert sent_grads, f"rank {rank} of {n} reduce-scattered nothing. {run.log.summary()}"
        sent, own = torch.cat(sent_grads), torch.cat(own_grads)
        scale = float(sent @ own) / max(float(own @ own), 1e-300)
        diff = float((sent - scale * own).abs().max())
        assert scale > 0 and diff <= tolerance * max(1.0, float(sent.abs().max())), (
            f"rank {rank} of {n}: what it reduce-scattered is not its own shard's gradient of "
            "each layer (the gradient of problem.batch(step, rank)'s loss, flattened weight "
            "then bias and padded with zeros), up to one constant factor. Each rank "
            "reduce-scatters the gradient of its own examples; the collective adds the ranks'."
        )


def assert_one_layer_at_a_time(runs: list[BenchRun], bench: FsdpBench) -> None:
    """At most one layer's full weights were alive at once, and at some moment the largest
    layer's: measured by storage lifetime (views, ``.detach()``/``.data`` aliases, tensors
    saved for backward and copies of the weights all count as their layer), and the meter's
    count of buffers handed out agrees with the recorder's count of all-gathers."""
    n, largest = bench.world_size, bench.largest_layer_bytes()
    for rank, run in enumerate(runs):
        gathers = run.log.count(GATHER)
        assert run.buffers == gathers == run.gathers_into_buffers, (
            f"rank {rank} of {n}: the bench handed out {run.buffers} full buffers, the "
            f"recorder saw {gathers} all-gathers, {run.gathers_into_buffers} of them into a "
            "buffer of the bench. Gather each layer, each time, into a fresh "
            "bench.full_buffer(layer): one buffer per gather."
        )
        copied = (
            f" ({run.copies} copies of full weights were made: clone, copy_, to, cat, ...; "
            "a copy counts as long as its storage lives)"
            if run.copies
            else ""
        )
        assert len(run.peak_layers) <= 1 and run.peak_full_bytes <= largest, (
            f"rank {rank} of {n}: the full weights of layers {list(run.peak_layers)} were "
            f"alive at once, {run.peak_full_bytes:,} bytes{copied}; ZeRO-3 holds one layer at "
            f"a time, at most the largest, {largest:,} bytes. Drop a layer's gathered weights "
            "when its forward returns: keep no view, alias (.detach(), .data) or copy of them "
            "on ctx, in a list or anywhere else (save the input and the shard) and gather "
            "again in backward."
        )
        assert run.peak_full_bytes == largest, (
            f"rank {rank} of {n}: at most {run.peak_full_bytes:,} bytes of full weights were "
            f"alive at once; the largest layer's buffer is {largest:,}. Gather every layer "
            "into a buffer from bench.full_buffer(layer), so that the bench sees the full "
            "weights."
        )
