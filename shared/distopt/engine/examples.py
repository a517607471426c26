"""Small worker functions for ``distopt.launch``, used by the tests and the notebooks.

They live in a module (not in a notebook) because spawned ranks import them by name.
Each takes ``(rank, world_size, ...)`` and runs inside an initialised gloo process group.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def allreduce_rank(rank: int, world_size: int) -> float:
    """All-reduce (sum) a tensor holding ``rank + 1``; every rank returns the same sum.

    The expected result is ``world_size * (world_size + 1) / 2``.
    """
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return float(value.item())


def rank_info(rank: int, world_size: int) -> dict[str, int | str | None]:
    """What a rank sees of its process; prints to stdout and stderr, which launch captures.

    Returns the rank, world size, process id, ``OMP_NUM_THREADS`` and torch's thread count.
    """
    print(f"rank {rank}: hello on stdout")
    print(f"rank {rank}: hello on stderr", file=sys.stderr)
    # Below Python's sys.stdout, as C++ libraries write: launch redirects the fds too.
    os.write(1, f"rank {rank}: hello on fd 1\n".encode())
    dist.barrier()
    return {
        "rank": rank,
        "world_size": world_size,
        "pid": os.getpid(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_num_threads": torch.get_num_threads(),
    }


def raise_on_rank(rank: int, world_size: int, bad_rank: int) -> None:
    """``bad_rank`` raises ValueError; the others wait in a barrier it never reaches."""
    if rank == bad_rank:
        # Shows up in the error message, which quotes the end of the failing rank's output.
        print(f"rank {rank}: about to raise", file=sys.stderr)
        raise ValueError(f"boom on rank {rank}")
    dist.barrier()


def hang_on_rank(rank: int, world_size: int, bad_rank: int) -> float:
    """``bad_rank`` sleeps forever; the others block in an all-reduce waiting for it."""
    if rank == bad_rank:
        while True:
            time.sleep(1.0)
    return allreduce_rank(rank, world_size)


def exit_on_rank(rank: int, world_size: int, bad_rank: int) -> float:
    """``bad_rank`` exits abruptly with code 3, without reporting; the others all-reduce."""
    if rank == bad_rank:
        os._exit(3)
    return allreduce_rank(rank, world_size)


def flood_on_rank(rank: int, world_size: int, bad_rank: int, megabytes: int) -> None:
    """Rank ``bad_rank`` prints ``megabytes`` MB on one line, then raises with a message as
    long; the others return."""
    if rank == bad_rank:
        print("first words " + "x" * (megabytes * 2**20) + " last words", flush=True)
        raise ValueError("start of the message " + "y" * (megabytes * 2**20) + " its end")


def kill_group_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` sends SIGKILL to its own process group; the others return their rank."""
    import signal

    if rank == bad_rank:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return rank
