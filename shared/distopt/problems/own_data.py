"""A rank holds only its own data: the guard every rank bench shares.

A bench (:class:`distopt.problems.shards.ShardedProblem`, the gossip ring's, the federated
clients') is shipped whole to every rank, because a rank must be able to ask it for its own
shard. Inside a process group it answers a rank about that rank only, and refuses what only
the test may see (the whole batch, another rank's shard, the single-process answers) with a
:class:`ForeignShardError` that says what to do instead: on a real cluster the other shards
are on other machines, and what a rank knows of them must reach it by a message. Outside a
process group (the test's own process) every answer is open.
"""

from __future__ import annotations

__all__ = ["ForeignShardError", "current_rank", "refuse_inside_ranks", "refuse_other_rank"]


class ForeignShardError(PermissionError):
    """A rank asked its bench for data that only another rank, or only the test, holds."""


def current_rank() -> int | None:
    """This process's rank if it is in a process group, else None (the test's own process)."""
    import torch.distributed as dist  # only where torch is present: every rank has it

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def refuse_other_rank(rank: int, what: str, instead: str) -> None:
    """Inside a process group, refuse rank ``rank``'s ``what`` to any other rank."""
    me = current_rank()
    if me is not None and rank != me:
        raise ForeignShardError(
            f"rank {me} asked the bench for rank {rank}'s {what}: a rank holds only its own "
            f"data. {instead}"
        )


def refuse_inside_ranks(what: str, instead: str) -> None:
    """Inside a process group, refuse ``what``, which only the test may see."""
    me = current_rank()
    if me is not None:
        raise ForeignShardError(
            f"rank {me} called {what}, which holds every rank's data or the answer: inside a "
            f"rank it is refused. {instead}"
        )
