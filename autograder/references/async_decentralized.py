"""Section 05's reference answers of its rank exercises, on the grader's side: not in the
package students get (issue 53, item 9; section 03's are in :mod:`.model_parallel`).

The course's own tests use them as known-good answers for the checks
(:mod:`distopt.ranks.gossip_checks`, :mod:`distopt.ranks.async_checks`); the notebook's
hidden tests compare with the numpy simulators instead, because the grading kernel cannot
import this package.

* :func:`ring_gossip_sgd`: decentralized SGD on a ring of ranks (Koloskova et al. 2020,
  Algorithm 1): a local step, the half-step sent to both neighbours and theirs received,
  then the Metropolis-Hastings average, 1/3 each;
* :func:`async_server`: the asynchronous parameter server: a gradient from whichever worker
  sends first, applied with its staleness's step size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distopt.ranks import async_ranks
from distopt.ranks.async_ranks import AsyncBench, AsyncPart
from distopt.ranks.gossip_ranks import GossipPart, GossipProblem

__all__ = ["async_server", "ring_gossip_sgd"]


def ring_gossip_sgd(
    rank: int, world_size: int, problem: GossipProblem | GossipPart
) -> torch.Tensor:
    """Decentralized SGD on a ring (a ``launch`` worker): returns this rank's models after
    every step, a float64 tensor (steps + 1, d), row 0 the first model.

    Each step: a local SGD step on this rank's minibatch; the result sent to both
    neighbours and theirs received (:func:`_exchange`); then the Metropolis-Hastings
    average, 1/3 each.
    """
    neighbours = ((rank - 1) % world_size, (rank + 1) % world_size)
    models = [problem.start(rank)]
    for step in range(problem.steps):
        half_step = models[-1] - problem.lr * problem.gradient(step, rank, models[-1])
        models.append((half_step + sum(_exchange(half_step, neighbours))) / 3)
    return torch.stack(models)


def _exchange(vector: torch.Tensor, neighbours: tuple[int, ...]) -> list[torch.Tensor]:
    """``vector`` sent to each of ``neighbours`` and one vector received from each, all the
    messages posted before any is waited for (so no order of the ranks can deadlock)."""
    received = [torch.empty_like(vector) for _ in neighbours]
    requests = [dist.isend(vector, peer) for peer in neighbours]
    requests += [dist.irecv(r, peer) for r, peer in zip(received, neighbours, strict=True)]
    for request in requests:
        request.wait()
    return received


def async_server(
    rank: int, world_size: int, bench: AsyncBench | AsyncPart
) -> tuple[torch.Tensor, list[int], list[int]]:
    """The parameter server (rank 0): section 05's exercise ``async_server``.

    Sends version 0 to every worker; then, num_updates times: receives a gradient from
    whichever worker sends first, staleness = version now - version it was computed at,
    ``w <- w - step_size(staleness) * g``, and answers that worker with the new weights.
    Returns the weights after every update (num_updates + 1, d), the staleness of each
    update and the rank it came from.
    """
    w, version = bench.start(), 0
    for worker in range(1, world_size):
        dist.send(async_ranks.pack(version, w), worker)
    message = torch.empty(bench.num_features + 1, dtype=torch.float64)
    weights, staleness, workers = [w], [], []
    while version < bench.num_updates:
        worker = dist.recv(message)  # any source: the first to arrive
        read_version, gradient = async_ranks.unpack(message)
        tau = version - read_version
        w = w - bench.step_size(tau) * gradient
        version += 1
        dist.send(async_ranks.pack(version, w), worker)
        weights.append(w)
        staleness.append(tau)
        workers.append(worker)
    async_ranks.stop_workers(world_size, bench)
    return torch.stack(weights), staleness, workers
