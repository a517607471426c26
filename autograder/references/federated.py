"""Section 06's reference answer of its rank exercise, on the grader's side: not in the
package students get (issue 53, item 9).

The course's own tests use it as the known-good answer for the checks
(:mod:`distopt.ranks.federated_checks`); the notebook's hidden tests compare with the numpy
simulator instead, because the grading kernel cannot import this package.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from distopt.problems.logistic import logistic_grad
from distopt.ranks.federated_ranks import SERVER, FederatedBench, FederatedPart
from distopt.sim import federated

__all__ = ["fedavg_ranks"]


def fedavg_ranks(rank: int, world_size: int, bench: FederatedBench | FederatedPart) -> np.ndarray:
    """FedAvg with the server on rank 0 and client k on rank k + 1 (a ``launch`` worker).

    Each round the server sends the global model to each sampled client (``dist.send``),
    each runs its local SGD steps from it and sends its model back, and the server averages
    them weighted by n_k / sum n_k (McMahan et al. 2017, Algorithm 1). A client that is not
    sampled sends and receives nothing. At the end the server broadcasts the final model.
    Returns it (dim,), the same on every rank.
    """
    if world_size != bench.world_size:
        raise ValueError(f"the bench needs {bench.world_size} ranks, got {world_size}")
    w = torch.zeros(bench.dim, dtype=torch.float64)
    if rank != SERVER:
        client = rank - 1
        X, y = bench.client_data(client)
        rng = bench.client_rng(client)
    for chosen in bench.participants():
        if rank == SERVER:
            models = []
            for k in chosen:
                dist.send(w, dst=k + 1)
            for k in chosen:
                model = torch.empty_like(w)
                dist.recv(model, src=k + 1)
                models.append(model.numpy())
            sizes = [bench.client_sizes[k] for k in chosen]
            w = torch.from_numpy(federated.average_models(np.array(models), sizes, "examples"))
        elif client in chosen:
            dist.recv(w, src=SERVER)  # this round starts from the global model
            local = w.numpy().copy()
            for _ in range(bench.steps_of(client)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            dist.send(torch.from_numpy(local), dst=SERVER)
    dist.broadcast(w, src=SERVER)
    return w.numpy()
