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

import os
from typing import Any, ClassVar

__all__ = [
    "NO_RANK",
    "ForeignShardError",
    "KeepsHome",
    "RankPart",
    "current_rank",
    "mark_received",
    "refuse_inside_ranks",
    "refuse_other_rank",
]


class ForeignShardError(PermissionError):
    """A rank asked its bench for data that only another rank, or only the test, holds."""


# Where a bench was made in a process that is not a rank: it answers everything there only.
# A process the bench was shipped to (another pid) that is in no process group, or left its
# group (``dist.destroy_process_group()``), is "no rank": everything rank-specific refuses.
NO_RANK = -1


def current_rank(home_pid: int | None = None) -> int | None:
    """This process's rank if it is in a process group, else None (the test's own process).

    Out of any group, a process that was in one before (a rank that left its group), or
    with ``home_pid`` (the pid of the process that made the bench) any process but that one,
    is :data:`NO_RANK`: a shipped bench answers it nothing.
    """
    import torch.distributed as dist  # only where torch is present: every rank has it

    global _rank_seen
    if dist.is_available() and dist.is_initialized():
        _rank_seen = dist.get_rank()
        return _rank_seen
    if _rank_seen is not None:  # was a rank: leaving the group does not open the bench
        return NO_RANK
    return NO_RANK if home_pid is not None and os.getpid() != home_pid else None


_rank_seen: int | None = None  # this process's rank, once it has been seen in a group


def mark_received() -> None:
    """Called where a bench is unpickled in a process other than the one that made it (a
    rank, before it joins its group): from then on, out of a group, this process is
    :data:`NO_RANK`, even for a bench it builds itself."""
    global _rank_seen
    if _rank_seen is None:
        _rank_seen = NO_RANK


def refuse_other_rank(rank: int, what: str, instead: str, home_pid: int | None = None) -> None:
    """Inside a process group, refuse rank ``rank``'s ``what`` to any other rank (with
    ``home_pid``, also in a shipped copy out of its group: see :func:`current_rank`)."""
    me = current_rank(home_pid)
    if me is not None and rank != me:
        raise ForeignShardError(
            f"rank {me} asked the bench for rank {rank}'s {what}: a rank holds only its own "
            f"data. {instead}"
        )


def refuse_inside_ranks(what: str, instead: str, home_pid: int | None = None) -> None:
    """Inside a process group, refuse ``what``, which only the test may see (with
    ``home_pid``, also in a shipped copy out of its group)."""
    me = current_rank(home_pid)
    if me is not None:
        raise ForeignShardError(
            f"rank {me} called {what}, which holds every rank's data or the answer: inside a "
            f"rank it is refused. {instead}"
        )


class KeepsHome:
    """For a frozen dataclass bench: remember the process that made it (call
    :meth:`_remember_home` in ``__post_init__``) and, when it is unpickled in another process
    (a rank), mark that process with :func:`mark_received`, so that a rank that leaves its
    group is still refused (pass ``self._home_pid`` to the refusals)."""

    _home_pid: int | None = None  # the maker's pid; None: made before this guard existed

    def _remember_home(self) -> None:
        object.__setattr__(self, "_home_pid", os.getpid())

    def __reduce__(self) -> tuple:
        import dataclasses

        values = tuple(getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]
        return _unpickled_bench, (type(self), values, self._home_pid)


def _unpickled_bench(cls: type, values: tuple, home_pid: int | None) -> KeepsHome:
    """A :class:`KeepsHome` bench unpickled: in another process than its maker's, mark that
    process (:func:`mark_received`); the copy keeps its maker's pid."""
    if home_pid is not None and os.getpid() != home_pid:
        mark_received()
    bench = cls(*values)
    object.__setattr__(bench, "_home_pid", home_pid)
    return bench


class RankPart:
    """For a rank's part of a bench (a frozen dataclass with a ``rank`` field, built in the
    launching process and shipped to that rank only): a method of the whole bench that the
    part does not have, because it holds other ranks' data, the reference run or the seed, is
    refused by its name with a :class:`ForeignShardError` that says what to do instead, not
    answered with a bare AttributeError. Settings the part leaves out (the seed) are absent.

    A part names its whole bench's class in ``_whole`` and what a rank should do in
    ``_instead`` (plain class attributes, not fields).
    """

    _whole: ClassVar[type] = object
    _instead: ClassVar[str] = ""

    def __getattr__(self, name: str) -> Any:
        # Called only for names the part lacks; never reads a missing attribute of its own
        # (an instance being unpickled has no fields yet).
        whole = type(self)._whole
        if name.startswith("__") or not callable(getattr(whole, name, None)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        rank = self.__dict__.get("rank", "?")
        raise ForeignShardError(
            f"rank {rank} asked its part of the bench for {name}(): a rank holds only its own "
            f"data, and {whole.__name__}.{name}() holds more (other ranks' data, the reference "
            f"run or the seed), which stay in the launching process. {type(self)._instead}"
        )
