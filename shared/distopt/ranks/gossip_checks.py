"""Checks of a student's ring gossip rank code (section 05), each failure saying what differed.

* :func:`assert_models_match`: every rank's models after every step against the numpy
  simulator's (:func:`distopt.ranks.gossip_ranks.reference_models`), naming a typical wrong
  mixing where the models match one;
* :func:`assert_ring_traffic`: two messages of the whole model per step, to ranks r - 1 and
  r + 1 mod n, as many received, and no collective; and what each message carried (recorded
  with ``payloads=True``): in step t, both of rank r's messages are its half-step
  ``y = x_t - lr * grad_t(x_t)`` from its own model after t steps (the row it returned), one
  to each neighbour, step after step in order. Zeros, another rank's model or any decoy of
  the right size fail, and so does a rank that trains on something else than it sends.

The expected values are computed here, in the test's process, from the bench; the ranks'
own returned models only say which state each message must be the half-step of.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from distopt.engine.record import Recording
from distopt.ranks.gossip_ranks import GossipProblem, reference_models
from distopt.sim import gossip

__all__ = ["assert_messages_are_half_steps", "assert_models_match", "assert_ring_traffic"]


def _known_mistakes(problem: GossipProblem) -> dict[str, np.ndarray]:
    """Trajectories (steps + 1, n, d) of a few wrong updates, to name the one a rank made."""
    n, shards, rows = problem.world_size, problem.shards(), problem.all_rows()

    def run(weights: np.ndarray) -> np.ndarray:
        return gossip.decentralized_sgd_trajectory(
            shards, weights, rows=rows, lr=problem.lr, start=problem.starts()
        )

    shift = np.roll(np.eye(n), 1, axis=1)
    mistakes = {
        "an average over all ranks (gossip mixes with the two ring neighbours only)": run(
            np.full((n, n), 1 / n)
        ),
        "weights 1/2 to itself and 1/4 to each neighbour (Metropolis-Hastings gives 1/3 each "
        "on a ring)": run((2 * np.eye(n) + shift + shift.T) / 4),
        "weights 1/2 to each neighbour and none to itself": run((shift + shift.T) / 2),
        "no mixing at all (each rank only took its own SGD steps)": run(np.eye(n)),
    }
    # Lian et al.'s order, X <- W X - eta G: mix the old models, then step.
    weights, x = gossip.ring_weights(n), problem.starts()
    lian = [x]
    for step_rows in rows:
        grads = np.stack([s.grad(x[i], step_rows[i]) for i, s in enumerate(shards)])
        x = weights @ x - problem.lr * grads
        lian.append(x)
    mistakes["X <- W X - lr G: the old models mixed (the exercise steps first, then mixes)"] = (
        np.stack(lian)
    )
    return mistakes


def assert_models_match(
    results: list[tuple[Any, Recording]], problem: GossipProblem, *, tolerance: float = 1e-12
) -> None:
    """Every rank's models after every step equal its row of :func:`reference_models`.

    results -- what ``launch(traced(fn), ...)`` returned: (models (steps + 1, d), recording)
    """
    expected = reference_models(problem)
    n, d = problem.world_size, problem.num_features
    assert len(results) == n, f"expected results from {n} ranks, got {len(results)}"
    for rank, (value, _) in enumerate(results):
        got = np.asarray(torch.as_tensor(value, dtype=torch.float64))
        assert got.shape == (problem.steps + 1, d), (
            f"rank {rank} of {n} returned shape {got.shape}; expected its models after every "
            f"step, (steps + 1, d) = ({problem.steps + 1}, {d}), row 0 its first model"
        )
        errors = np.abs(got - expected[:, rank]).max(axis=1)
        if errors.max() <= tolerance:
            continue
        step = int(np.argmax(errors > tolerance))
        named = [
            what
            for what, trajectory in _known_mistakes(problem).items()
            if np.abs(got - trajectory[:, rank]).max() <= tolerance
        ]
        diagnosis = (
            f" Its models match {named[0]}."
            if named
            else " Is the gradient taken at this rank's own model, the step taken before the "
            "mixing, and each neighbour's half-step weighted 1/3?"
        )
        raise AssertionError(
            f"rank {rank} of {n}: its model after step {step} differs from node {rank}'s row "
            f"of the numpy simulator X <- W (X - lr G) by {errors[step]:.2e} (tolerance "
            f"{tolerance:g}); expected {np.array2string(expected[step, rank][:3], precision=6)}"
            f"... got {np.array2string(got[step][:3], precision=6)}....{diagnosis}"
        )


def assert_ring_traffic(results: list[tuple[Any, Recording]], problem: GossipProblem) -> None:
    """Every rank sent 2 messages per step, the whole model, one to each ring neighbour,
    received as many from them, made no collective call, and each message carried its
    half-step of that step (:func:`assert_messages_are_half_steps`)."""
    n, steps, size = problem.world_size, problem.steps, problem.model_bytes
    for rank, (_, log) in enumerate(results):
        left, right = (rank - 1) % n, (rank + 1) % n
        neighbours = Counter({left: steps}) + Counter({right: steps})
        collectives = [c.name for c in log.collectives()]
        assert not collectives, (
            f"rank {rank} of {n} called {sorted(set(collectives))}: gossip uses no collective "
            f"(every rank waits in one, and an average over all ranks is not gossip); talk "
            f"only to your two neighbours, with send/recv or isend/irecv. Your traffic: "
            f"{log.summary()}"
        )
        for calls, verb, preposition in ((log.sent(), "sent", "to"),
                                         (log.received(), "received", "from")):  # fmt: skip
            assert len(calls) == 2 * steps, (
                f"rank {rank} of {n} {verb} {len(calls)} messages in {steps} steps; expected 2 "
                f"per step, one {preposition} each neighbour. Your traffic: {log.summary()}"
            )
            peers = Counter(c.peer for c in calls)
            assert None not in peers, (
                f"rank {rank} of {n} {verb} {peers[None]} messages whose peer the recorder did "
                f"not see: give the neighbour's rank as dst= / src= of dist.isend, dist.irecv, "
                f"dist.send or dist.recv (a receive from any source cannot be checked)"
            )
            assert peers == neighbours, (
                f"rank {rank} of {n} {verb} messages {preposition} ranks {dict(peers)} "
                f"(rank: count); expected {steps} {preposition} each ring neighbour, ranks "
                f"{left} and {right} ((rank - 1) % world_size and (rank + 1) % world_size)"
                + (", which with 2 ranks are the same rank" if n == 2 else "")
            )
            sizes = sorted({c.payload_bytes for c in calls})
            assert sizes == [size], (
                f"rank {rank} of {n} {verb} messages of {sizes} bytes; expected each the whole "
                f"model, {problem.num_features} float64 = {size} bytes"
            )
    assert_messages_are_half_steps(results, problem)


def assert_messages_are_half_steps(
    results: list[tuple[Any, Recording]], problem: GossipProblem, *, tolerance: float = 1e-12
) -> None:
    """Rank r's sends, in order, are two per step: in step t, to ranks r - 1 and r + 1 (either
    first), each carrying ``y_t = x_t - lr * problem.gradient(t, r, x_t)``, where ``x_t`` is
    the model after t steps that the rank returned. Needs the payloads recorded
    (``record.run_traced(..., payloads=True)``)."""
    n, steps, d = problem.world_size, problem.steps, problem.num_features
    for rank, (value, log) in enumerate(results):
        left, right = (rank - 1) % n, (rank + 1) % n
        sent = log.sent()
        assert len(sent) == 2 * steps, (
            f"rank {rank} of {n} sent {len(sent)} messages in {steps} steps; expected 2 per "
            f"step, its half-step to each neighbour"
        )
        assert all(len(c.payload) == 1 for c in sent), (
            "the recording holds no message contents: run the ranks with "
            "record.run_traced(fn, problem, payloads=True) so that each message can be checked"
        )
        models = torch.as_tensor(np.asarray(value, dtype=np.float64))
        assert tuple(models.shape) == (steps + 1, d), (
            f"rank {rank} of {n} returned shape {tuple(models.shape)}; expected its models "
            f"after every step, (steps + 1, d) = ({steps + 1}, {d}), row 0 its first model"
        )
        for step in range(steps):
            x = models[step]
            half_step = x - problem.lr * problem.gradient(step, rank, x)
            pair = sent[2 * step : 2 * step + 2]
            peers = sorted(c.peer for c in pair if c.peer is not None)
            assert peers == sorted([left, right]), (
                f"rank {rank} of {n}: its messages {2 * step} and {2 * step + 1} (step {step}) "
                f"went to ranks {[c.peer for c in pair]}; expected one to each neighbour, "
                f"ranks {left} and {right}, in every step before the next step's"
            )
            for call in pair:
                got = call.payload[0].reshape(-1).to(torch.float64)
                error = float((got - half_step).abs().max()) if got.numel() == d else float("inf")
                if error <= tolerance:
                    continue
                what = _what_was_sent(got, x, half_step, tolerance)
                raise AssertionError(
                    f"rank {rank} of {n}, step {step}: the message to rank {call.peer} carried "
                    f"{np.array2string(got[:3].numpy(), precision=6)}...; expected the rank's "
                    f"half-step y = x - lr * problem.gradient({step}, {rank}, x) = "
                    f"{np.array2string(half_step[:3].numpy(), precision=6)}..., from x its "
                    f"model after {step} steps as it returned it (differs by {error:.2e}, "
                    f"tolerance {tolerance:g}).{what}"
                )


def _what_was_sent(
    got: torch.Tensor, x: torch.Tensor, half_step: torch.Tensor, tolerance: float
) -> str:
    """Names a typical wrong message: the model before its step, zeros."""
    if got.numel() != half_step.numel():
        return f" It holds {got.numel()} values, not the model's {half_step.numel()}."
    if float((got - x).abs().max()) <= tolerance:
        return (
            " It is the model before the local step: send y, the model after this rank's own "
            "SGD step, and mix the neighbours' y with your own."
        )
    if float(got.abs().max()) == 0:
        return " It is all zeros: a message must carry the half-step itself."
    return " Is each message the half-step the rank itself then mixes?"
