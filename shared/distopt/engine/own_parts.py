"""Each rank its own part of a bench, built in the launching process: nothing else travels.

A bench that can cut itself into per-rank parts (``bench.own_part(rank)``: that rank's rows,
its first model, the settings; no seed and nothing of another rank) is shipped part by part:
:class:`OwnParts` writes each part to its own file of a private folder, and each rank reads
and deletes its own before the rank code starts (:func:`on_own_part`). What every rank gets is
only the files' paths, so no object inside a rank can answer for another rank by any method,
public or private: the other ranks' data reach it by messages, as on a cluster.
``distopt.launch`` ships this way every such bench among its arguments (its class says
``ships_by_parts = True``), there or inside tuples and lists of them. Any other copy that
would travel with the rank code (a notebook global or a closure the rank function names, a
bench inside another object) is replaced by :class:`Withheld`, which answers nothing: a
bench never reaches a rank whole.
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["OwnParts", "Withheld", "WithheldBench", "on_own_part", "parts_of"]


class OwnParts:
    """Each rank's part of a bench, built in the launching process, handed to that rank only.

    ``with OwnParts(parts) as handle: launch(fn, len(parts), handle, ...)``; in rank r,
    ``handle.take(r)`` returns ``parts[r]``. Every part is pickled into its own file of a
    fresh private folder; a rank reads its own file and deletes it, then waits for every rank
    to have done the same (a barrier), so that when the rank code starts no other rank's part
    exists anywhere it could read. What travels to every rank is only the files' paths: the
    bench, its seed and the reference stay in the launching process. The folder is removed
    when the block ends.
    """

    def __init__(self, parts: Sequence[Any]) -> None:
        self.folder = tempfile.mkdtemp(prefix="distopt-parts-")  # mode 0700
        self.paths: list[str] = []
        for rank, part in enumerate(parts):
            path = os.path.join(self.folder, f"{rank}-{secrets.token_hex(8)}.pickle")
            with open(path, "wb") as file:
                pickle.dump(part, file)
            self.paths.append(path)

    def __enter__(self) -> OwnParts:
        return self

    def __exit__(self, *exc: Any) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "paths": list(self.paths)}

    def take(self, rank: int) -> Any:
        """This rank's part (once): read, delete its file, then wait for every rank."""
        import torch.distributed as dist

        path = self.paths[rank]
        with open(path, "rb") as file:
            part = pickle.load(file)
        os.unlink(path)
        from distopt.problems import own_data  # the guard of the whole benches

        own_data.current_rank()  # this process is a rank from now on, in a group or not
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        return part


def on_own_part(fn: Callable[..., Any], rank: int, world_size: int, parts: OwnParts, *args: Any):
    """In a rank: take this rank's part, then ``fn(rank, world_size, part, *args)``. Launch
    ``functools.partial(on_own_part, fn)`` with an :class:`OwnParts`: the part is read (and the
    ranks' barrier passed) before ``fn`` starts, so ``fn``'s recorder sees none of it."""
    return fn(rank, world_size, parts.take(rank), *args)


def parts_of(bench: Any, world_size: int) -> list[Any]:
    """``[bench.own_part(r) for r in range(world_size)]``, built in this process."""
    return [bench.own_part(rank) for rank in range(world_size)]


class WithheldBench(PermissionError):
    """Rank code used a whole bench that reached it by a name outside its arguments."""


class Withheld:
    """What a rank gets in place of a whole bench that its code reaches through a notebook
    global, a closure or a container (:func:`distopt.engine.shipping.dumps` puts it there):
    any use raises :class:`WithheldBench`, saying to use the rank's own part instead."""

    def __init__(self, kind: str) -> None:
        object.__setattr__(self, "_kind", kind)

    def __getattr__(self, name: str) -> Any:
        kind = object.__getattribute__(self, "_kind")
        raise WithheldBench(
            f"this rank's code reached a whole {kind} by a name outside its arguments (a "
            f"notebook global or a closure) and asked it for {name!r}. A rank never gets a "
            f"{kind} whole: it gets its own part, as the argument distopt.launch passes it; "
            "use that argument instead."
        )

    def __reduce__(self) -> tuple:
        return Withheld, (object.__getattribute__(self, "_kind"),)

    def __repr__(self) -> str:
        return f"<{object.__getattribute__(self, '_kind')} withheld from this rank>"
