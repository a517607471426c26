"""``torchrun`` entry point: the small GPT trained data-parallel with DDP or FSDP2.

    torchrun --standalone --nproc-per-node 2 -m distopt.project.train --parallel fsdp \\
        --steps 40 --checkpoint-dir /tmp/ckpt [--stop-after 20 | --resume] [--micro-batches 2]

gloo on CPUs, NCCL when CUDA is there. Parse the arguments, build the model (wrapped in
``DistributedDataParallel``, or sharded with ``fully_shard`` per block: :func:`parallelize`),
then run the course's one training loop (``distopt.project.loop.run_steps``) on this rank's
share of each batch, with gradient accumulation over ``--micro-batches`` and checkpoints
(``distopt.project.checkpoint``) that resume exactly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from distopt.project import checkpoint
from distopt.project.gpt import GPTConfig, flops_per_token
from distopt.project.history import empty_history
from distopt.project.loop import (
    DTYPES,
    TrainConfig,
    batch_at,
    make_model,
    make_optimizer,
    mean_over_ranks,
    run_steps,
)

__all__ = ["main", "parallelize"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="torchrun --standalone --nproc-per-node N -m distopt.project.train",
        description="Train the small GPT data-parallel with DDP or FSDP2 (gloo on CPU, NCCL on "
        "GPUs), with checkpoints that resume exactly.",
    )
    parser.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--steps", type=int, default=50, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences/step, all ranks")
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=1,
        help="gradient accumulation: backward passes per step",
    )
    parser.add_argument("--peak-lr", type=float, default=1e-2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--dtype",
        choices=["auto", *sorted(DTYPES)],
        default="auto",
        help="autocast dtype; auto: bfloat16 where the device computes it natively, else float32",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", type=Path, help="where checkpoints go")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    parser.add_argument("--stop-after", type=int, help="stop (and checkpoint) after this step")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoint-dir")
    parser.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="print tokens/s over the steps after the first two (warm-up), and FLOPs/token",
    )
    args = parser.parse_args(argv)
    for name in (
        "steps",
        "batch_size",
        "micro_batches",
        "d_model",
        "n_layer",
        "seq_len",
        "log_every",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be >= 0")
    if args.stop_after is not None and not 1 <= args.stop_after <= args.steps:
        parser.error(f"--stop-after must be in 1..--steps ({args.steps}), got {args.stop_after}")
    if (args.resume or args.stop_after or args.checkpoint_every) and not args.checkpoint_dir:
        parser.error("--resume, --stop-after and --checkpoint-every need --checkpoint-dir")
    if args.resume and not (args.checkpoint_dir / "meta.json").is_file():
        parser.error(f"--resume: no checkpoint in {args.checkpoint_dir} (meta.json missing)")
    world_size = int(os.environ.get("WORLD_SIZE", "0"))
    if world_size < 1 or "RANK" not in os.environ:
        parser.error(
            "not started by torchrun; run e.g. torchrun --standalone --nproc-per-node 2 "
            "-m distopt.project.train --parallel ddp --steps 20"
        )
    if args.batch_size % (world_size * args.micro_batches):
        parser.error(
            f"--batch-size {args.batch_size} must divide by {world_size} processes x "
            f"{args.micro_batches} micro-batches"
        )
    if args.d_model % 4:
        parser.error(f"--d-model must divide by the 4 attention heads, got {args.d_model}")
    return args


def _auto_dtype(use_cuda: bool) -> str:
    """bfloat16 where it is native (a CUDA GPU with bf16, a CPU that computes it fast), else
    float32. On CPU rank 0 measures (``distopt.machine``) and tells the others, so that every
    rank computes in the same format."""
    from distopt.machine import autocast_dtype

    if use_cuda:
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    native = dist.get_rank() == 0 and autocast_dtype() == "bfloat16"
    choice = torch.tensor([int(native)])
    dist.broadcast(choice, src=0)
    return "bfloat16" if choice.item() else "float32"


def _config(args: argparse.Namespace, use_cuda: bool) -> TrainConfig:
    return TrainConfig(
        model=GPTConfig(
            vocab_size=16, seq_len=args.seq_len, n_layer=args.n_layer, d_model=args.d_model
        ),
        batch_size=args.batch_size,
        micro_batches=args.micro_batches,
        steps=args.steps,
        peak_lr=args.peak_lr,
        warmup_steps=max(1, args.steps // 10),  # the recipe's warm-up: 10 % of the steps
        dtype=_auto_dtype(use_cuda) if args.dtype == "auto" else args.dtype,
        seed=args.seed,
    )


def parallelize(
    model: nn.Module,
    parallel: str,
    device: torch.device | str = "cpu",
    *,
    bucket_mb: float | None = None,
) -> tuple[nn.Module, Callable[[], AbstractContextManager]]:
    """The module to train and its ``no_sync`` switch (``loop.train_step``).

    ``"ddp"``: ``DistributedDataParallel``'s wrapper, which all-reduces the gradients in
    buckets of at most ``bucket_mb`` MiB (None: DDP's default, 25) while the backward pass
    runs, and its own ``no_sync``. ``"fsdp"``: the model
    itself, sharded with FSDP2 (``fully_shard`` on each block, then on the whole), whose
    backward reduce-scatters each block's gradients; its switch turns that off for the
    micro-batches before the last (the unsharded gradients then add up locally).
    Call it in each rank after the process group is up, before the optimizer is built
    (FSDP2 replaces the parameters with their shards).
    """
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(
            model,
            device_ids=[device] if torch.device(device).type == "cuda" else None,
            bucket_cap_mb=bucket_mb,
        )
        return wrapped, wrapped.no_sync
    if parallel != "fsdp":
        raise ValueError(f'parallel must be "ddp" or "fsdp", got {parallel!r}')
    if bucket_mb is not None:
        raise ValueError("bucket_mb is DDP's setting; FSDP2 communicates block by block")
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)

    @contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return model, no_sync


def _throughput_line(step_ends: list[float], config: TrainConfig) -> str:
    """``throughput T tokens/s over K steps, F FLOPs/token`` (all ranks together), timed from
    the end of the second step: the first ones compile kernels and fill allocator caches."""
    timed = step_ends[1:]
    if len(timed) < 2:
        return "throughput: too few steps to time (run at least 4)"
    tokens = (len(timed) - 1) * config.batch_size * config.model.seq_len
    seconds = timed[-1] - timed[0]
    return (
        f"throughput {tokens / seconds:.6g} tokens/s over {len(timed) - 1} steps, "
        f"{flops_per_token(config.model):.6g} FLOPs/token"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse, build, run (see the module docstring and ``--help``)."""
    args = _parse_args(argv)
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # ranks share the cores
    config = _config(args, use_cuda)
    model = make_model(config).to(device)
    wrapped, no_sync = parallelize(model, args.parallel, device)
    optimizer = make_optimizer(model, config)
    start, history = 0, empty_history()
    if args.resume:
        start, history = checkpoint.load(args.checkpoint_dir, model, optimizer)
    if args.checkpoint_dir and rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    stop = args.stop_after or args.steps
    rank_batches = batch_at(config, rank=rank, world_size=world_size)
    step_ends: list[float] = []  # wall clock at the end of each step (--throughput)

    def after_step(step: int, history: dict) -> None:
        if args.throughput:
            if use_cuda:
                torch.cuda.synchronize()
            step_ends.append(time.perf_counter())
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == stop):
            print(f"step {step + 1}/{args.steps}  loss {history['loss'][-1]:.4f}", flush=True)
        every = args.checkpoint_every and (step + 1) % args.checkpoint_every == 0
        if args.checkpoint_dir and (step + 1 == stop or every):
            checkpoint.save(args.checkpoint_dir, model, optimizer, step + 1, history)

    run_steps(
        wrapped, optimizer, config, lambda step: rank_batches(step).to(device),
        start=start, stop=stop, history=history,
        mean_over_ranks=lambda loss: mean_over_ranks(loss, device),
        after_step=after_step, no_sync=no_sync,
    )  # fmt: skip
    if rank == 0 and args.throughput:
        print(_throughput_line(step_ends, config), flush=True)
    if rank == 0:
        where = f"; checkpoint in {args.checkpoint_dir}" if args.checkpoint_dir else ""
        print(
            f"{args.parallel} on {world_size} ranks, {config.dtype} compute: stopped after "
            f"step {stop}{where}"
        )
    # every rank past its last collective (the checkpoint's too) before any tears gloo down:
    # a rank whose peer closed the connection mid-operation aborts at exit
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalization: FSDP's modules still hold the gloo group,
    # and tearing its worker threads down while the interpreter is half gone can abort a rank
    # (SIGABRT, "terminate called without an active exception") after a run that finished.
    # Everything is written by now (the checkpoint behind a barrier, the log flushed here).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
