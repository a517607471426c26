"""Checks of a student's expert-parallel rank code (section 03), each failure saying what differed.

* :func:`run_expert_parallel`: ``fn(rank, world_size, problem.shard(rank))`` on the ranks of a
  :class:`~distopt.problems.moe_layer.MoELayer`, each shard built in the launching process and
  shipped to its rank only (:class:`~distopt.engine.own_parts.OwnParts`), each rank
  under the recorder with the payloads kept (:mod:`distopt.engine.record`); with
  ``guard=True`` a call of torch's differentiable all-to-alls or of the bench fails
  (:func:`distopt.grading.own_work`; the reference answer is not in this package). A launch that
  hangs or fails names the ranks that receive no rows and the experts that keep no copies,
  the two cases rank code most often forgets;
* :func:`assert_moe_matches`: each rank's output, input gradient and expert gradients against
  the single-process layer, dropped copies included;
* :func:`assert_all_to_all_traffic`: the split sizes exchanged first, then four all-to-alls of
  token rows, two in the forward pass and two in the backward pass, each sending every rank
  exactly the rows the routing sends it (the recorder's bytes per rank), and carrying what
  it should: the tokens to their experts, the experts' results (zeros for dropped copies)
  back in the order they came; in the backward pass the gated gradient rows of the rank's
  copies, then its experts' input gradients (zeros for dropped copies). A rank that receives
  no rows still joins all four (with empty buffers): the failure says so in words.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed.nn.functional as differentiable

from distopt.engine import record
from distopt.engine.launcher import LaunchError, launch
from distopt.engine.own_parts import OwnParts
from distopt.engine.record import Call, Recording
from distopt.grading import own_work
from distopt.problems.moe_layer import MoELayer, MoEReference

__all__ = [
    "ANSWERS",
    "assert_all_to_all_traffic",
    "assert_moe_matches",
    "dispatch_rows",
    "run_expert_parallel",
]

# What the rank code may not call: torch's all-to-alls that carry their own backward (the
# exercise is to write that backward), and the bench.
ANSWERS: tuple[Callable, ...] = (
    differentiable.all_to_all_single,
    differentiable._AlltoAllSingle,
    MoELayer,
)
_TOKENS = "all_to_all_single"


def _moe_rank(fn: Callable, guard: bool, rank: int, world_size: int, parts: OwnParts):
    shard = parts.take(rank)
    fn = own_work(fn, *ANSWERS) if guard else fn
    with record.communication(payloads=True) as log:
        value = fn(rank, world_size, shard)
    return value, log


def run_expert_parallel(
    fn: Callable, problem: MoELayer, *, guard: bool = True, timeout: float = 30
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, problem.shard(rank))`` on ``problem.world_size`` ranks.

    Returns ``(fn's value, its Recording)`` per rank, in rank order, with each call's payload.
    """
    runner = functools.partial(_moe_rank, fn, guard)
    with OwnParts([problem.shard(r) for r in range(problem.world_size)]) as parts:
        try:
            return launch(runner, problem.world_size, parts, timeout=timeout)
        except LaunchError as error:
            empty = empty_cases(problem)
            if not empty:
                raise
            note = (
                f"\n\nIn this case {'; '.join(empty)}. Such a rank or expert still takes "
                "part in every all-to-all (with zero rows: an empty buffer and split sizes of "
                "0), forward and backward, or the other ranks wait for it forever; an expert "
                "that keeps no copies runs on an empty batch (its gradients are zeros)."
            )
            raise type(error)(str(error) + note, error.pids) from error


def empty_cases(problem: MoELayer) -> list[str]:
    """The ranks that receive no rows and the experts that keep no copies, in words."""
    counts, per_rank = problem.counts(), problem.experts_per_rank
    reference = problem.reference()
    kept, chosen = reference.kept, reference.chosen
    found = [
        f"rank {r} receives no rows" for r in range(problem.world_size) if not counts[:, r].sum()
    ]
    for e in range(problem.num_experts):
        if counts[:, e // per_rank].sum() and not bool(((chosen == e) & kept).any()):
            found.append(f"expert {e} (rank {e // per_rank}) keeps no copies")
    return found


def dispatch_rows(problem: MoELayer, reference: MoEReference, rank: int) -> torch.Tensor:
    """Indices (into ``reference.chosen.flatten()``) of the copies rank ``rank`` sends, in the
    order of its dispatch buffer: by expert, and by token for each expert."""
    t, k = problem.tokens_per_rank, problem.top_k
    mine = reference.chosen[rank * t : (rank + 1) * t].flatten()
    return rank * t * k + torch.argsort(mine, stable=True)


def _received_rows(problem: MoELayer, reference: MoEReference, rank: int) -> torch.Tensor:
    """Indices of the copies rank ``rank`` receives, in order: from rank 0 its copies for my
    first expert, then my second, ...; then from rank 1, and so on."""
    first = rank * problem.experts_per_rank
    mine = set(range(first, first + problem.experts_per_rank))
    flat = reference.chosen.flatten()
    return torch.cat(
        [
            rows[torch.tensor([int(flat[i]) in mine for i in rows], dtype=torch.bool)]
            for source in range(problem.world_size)
            if len(rows := dispatch_rows(problem, reference, source))
        ]
        or [torch.zeros(0, dtype=torch.long)]
    )


def _close(got: Any, expected: torch.Tensor, tolerance: float) -> float:
    """Largest absolute difference, or inf if the shapes differ."""
    got = torch.as_tensor(got).to(torch.float64)
    if tuple(got.shape) != tuple(expected.shape):
        return float("inf")
    if not expected.numel():
        return 0.0
    return float((got - expected).abs().max()) / max(1.0, float(expected.abs().max()))


def assert_moe_matches(
    results: Sequence[tuple[Any, Recording]], problem: MoELayer, *, tolerance: float = 1e-12
) -> None:
    """Every rank's output, input gradient and expert gradients equal the unsplit layer's.

    Each rank must return ``(output, input_grad, expert_grads)``: its (T, hidden) rows of the
    output and of dloss/dx, and the gradients of its experts' parameters in
    ``shard.experts.parameters()`` order.
    """
    reference = problem.reference()
    t, per_rank = problem.tokens_per_rank, problem.experts_per_rank
    dropped = problem.dropped()
    for rank, (value, _) in enumerate(results):
        who = f"rank {rank} of {problem.world_size}"
        assert isinstance(value, tuple | list) and len(value) == 3, (
            f"{who} returned {type(value).__name__}; expected (output, input_grad, expert_grads)"
        )
        output, input_grad, expert_grads = value
        mine = slice(rank * t, (rank + 1) * t)
        assert output is not None and input_grad is not None, (
            f"{who} returned None for its output or its input gradient"
        )
        diff = _close(output, reference.output[mine], tolerance)
        assert diff <= tolerance, (
            f"{who}: the output of its {t} tokens differs from the single-process layer by "
            f"{diff:.2e} (tolerance {tolerance:g}; {dropped} of {reference.chosen.numel()} "
            f"copies are over capacity {problem.capacity} in this case). Is each result added "
            "back to the row of its token, times that copy's gate (its router probability)? "
            "Does each expert keep only its first `capacity` copies, counted over all ranks "
            "in the order they arrive (rank 0's first), and return zeros for the others?"
        )
        diff = _close(input_grad, reference.input_grad[mine], tolerance)
        assert diff <= tolerance, (
            f"{who}: dloss/dx of its tokens differs from the single-process layer by "
            f"{diff:.2e}. The gradient of a dispatched copy is computed on the expert's rank: "
            "AllToAll's backward must send it back, with the split sizes swapped"
        )
        expected = [
            g
            for e in range(rank * per_rank, (rank + 1) * per_rank)
            for g in reference.expert_grads[e]
        ]
        grads = list(expert_grads)
        assert len(grads) == len(expected), (
            f"{who} returned {len(grads)} expert gradients; its {per_rank} experts have "
            f"{len(expected)} parameters (shard.experts.parameters())"
        )
        for index, (got, want) in enumerate(zip(grads, expected, strict=True)):
            expert = rank * per_rank + index // (len(expected) // per_rank)
            assert got is not None, (
                f"{who}: the gradient of its experts' parameter {index} (expert {expert}) is "
                "None: "
                + (
                    f"expert {expert} keeps no copies in this case, and its parameters got no "
                    "gradient. An expert that keeps no copies still runs on its empty batch "
                    "(expert(rows[:0])), so that its gradients are zeros"
                    if not bool(((reference.chosen == expert) & reference.kept).any())
                    else "did its results reach the combine, with the backward pass through them?"
                )
            )
            diff = _close(got, want, tolerance)
            assert diff <= tolerance, (
                f"{who}: the gradient of its experts' parameter {index} differs from the "
                f"single-process layer by {diff:.2e}. An expert's gradient sums over the copies "
                "it kept from every rank; the gradient of each result must reach it through the "
                "backward of the combining all-to-all"
            )


def _is_integer(call: Call) -> bool:
    return bool(call.payload) and not call.payload[0].is_floating_point()


def assert_all_to_all_traffic(results: Sequence[tuple[Any, Recording]], problem: MoELayer) -> None:
    """The split sizes first, then four all-to-alls of token rows that carry what they should.

    Per rank, in order: one ``all_to_all_single`` of the E integer counts of its copies per
    expert (E/N to each rank); then, outside the backward pass, the dispatch (its copies, rows
    of x sorted by expert then token, ``counts[r, j]`` of them to rank j) and the combine (the
    results of the copies it received, in the order received, zeros for dropped ones,
    ``counts[j, r]`` to rank j); during the backward pass the same two exchanges reversed,
    the combine's carrying the gradient of each returned row (its gate times dloss/dy of its
    token), the dispatch's each received row's expert input gradient (zeros if dropped). No
    other communication.
    """
    reference = problem.reference()
    counts, n, row = problem.counts(), problem.world_size, problem.row_bytes
    x_all = _all_tokens(problem)
    grad_outputs = torch.cat([problem.shard(r).grad_output for r in range(n)])
    flat_chosen = reference.chosen.flatten()
    for rank, (_, log) in enumerate(results):
        who = f"rank {rank} of {n}"
        others = sorted({c.name for c in log.calls} - {_TOKENS, "barrier"})
        assert not others, (
            f"{who} called {others}: expert parallelism moves the tokens with "
            f"dist.all_to_all_single only (each rank sends each other rank exactly the copies "
            f"its experts need). Its traffic: {log.summary()}"
        )
        calls = log.of(_TOKENS)
        assert calls and _is_integer(calls[0]), (
            f"{who}: its first all_to_all_single should exchange the split sizes (an integer "
            f"tensor of how many copies it sends to each expert), before any token travels; "
            f"got {[c.payload[0].dtype if c.payload else None for c in calls[:1]]}"
        )
        sent_per_expert = np.bincount(
            flat_chosen[dispatch_rows(problem, reference, rank)].numpy(),
            minlength=problem.num_experts,
        )
        got = calls[0].payload[0].flatten().tolist()
        assert got == sent_per_expert.tolist(), (
            f"{who}: the split sizes it sent were {got}; expected the number of its token copies "
            f"for each of the {problem.num_experts} experts, {sent_per_expert.tolist()} (the "
            "receivers size their buffers and find each expert's copies from them)"
        )
        forward, backward = _by_pass(log, calls[1:])
        dispatch = tuple(int(c) * row for c in counts[rank])
        combine = tuple(int(c) * row for c in counts[:, rank])
        expected = [dispatch, combine]
        for phase, found, why in (
            ("forward", forward, "the dispatch, then the combine"),
            ("backward", backward, "the combine's backward, then the dispatch's"),
        ):
            peer_bytes = [c.peer_bytes for c in found]
            nothing = (
                ""
                if counts[:, rank].sum()
                else f"{who} received no rows"
                + (f" and skipped its {phase} all-to-all(s). " if len(found) < 2 else ". ")
                + "A rank with no rows still joins every all-to-all, with empty buffers. "
            )
            assert peer_bytes == expected, (
                f"{nothing}{who}: in the {phase} pass its token all-to-alls sent these bytes to "
                f"ranks 0..{n - 1}: {[list(b) for b in peer_bytes]}; expected two, {why}: "
                f"{[list(b) for b in expected]} (the routing's copies, counts[i, j] = "
                f"{counts.tolist()} from rank i to rank j, times {problem.hidden} float64). "
                "Only the off-diagonal part crosses a link"
            )
        sent = forward[0].payload[0] if forward[0].payload else None
        want = x_all[dispatch_rows(problem, reference, rank) // problem.top_k]
        assert sent is not None and _close(sent, want, 0.0) == 0.0, (
            f"{who}: the dispatch did not carry its token copies in the order the receivers "
            "read them: rows of x, sorted by expert (so by destination rank), each expert's "
            "copies in token order"
        )
        received = _received_rows(problem, reference, rank)
        outputs = reference.expert_outputs.reshape(-1, problem.hidden)
        mine = dispatch_rows(problem, reference, rank)
        gated = reference.gates.flatten()[mine, None] * grad_outputs[mine // problem.top_k]
        input_grads = reference.expert_input_grads.reshape(-1, problem.hidden)
        for call, want, what in (
            (
                forward[1],
                outputs[received],
                "the combine did not send back its experts' results "
                "in the order the copies arrived: each received row's expert output, zeros for a "
                f"copy over capacity {problem.capacity}",
            ),
            (
                backward[0],
                gated,
                "the combine's backward did not send the gated gradient rows of "
                "its own copies, in the order it dispatched them: for each copy, its gate times "
                "dloss/dy of its token (the gradient of the returned row)",
            ),
            (
                backward[1],
                input_grads[received],
                "the dispatch's backward did not send back its "
                "experts' input gradients, in the order the copies arrived: for each received "
                "row, the gradient reaching the expert's input, zeros for a copy over capacity "
                f"{problem.capacity}",
            ),
        ):
            got = call.payload[0] if call.payload else None
            diff = float("inf") if got is None else _close(got, want, 1e-12)
            assert diff <= 1e-12, (
                f"{who}: {what} (largest difference {diff:.2e}; zeros or other rows of the "
                "right size do not pass)"
            )


def _by_pass(log: Recording, calls: list[Call]) -> tuple[list[Call], list[Call]]:
    """The calls among ``calls`` made outside any backward pass, and those made during one."""
    during = log.during_backward(_TOKENS)
    inside = [c for c in calls if any(c is d for d in during)]
    return [c for c in calls if all(c is not d for d in during)], inside


def _all_tokens(problem: MoELayer) -> torch.Tensor:
    """All ranks' tokens (N T, hidden), rank 0's first (outside the ranks only)."""
    return torch.cat([problem.shard(r).x for r in range(problem.world_size)])
