"""Training the small GPT with the lesson's recipe, in one process or under ``torchrun``.

The recipe (``distopt.recipe``): AdamW with betas (0.9, 0.95), weight decay on matrices
only, linear warm-up then cosine decay to 10 % of the peak, gradient clipping at global norm
1.0, the forward and backward passes under bfloat16 autocast while the weights, gradients and
Adam state stay float32 ("master weights", Micikevicius et al. 2018; on bfloat16 no loss
scaling is needed, its exponent range is float32's).

In one process::

    from distopt.train import TrainConfig, train
    model, history = train(TrainConfig(steps=200))

``history`` is the course's training log (a dict of lists): ``step``, ``loss``,
``grad_norm`` (before clipping), ``lr``, ``step_time`` (s), ``val_step``, ``val_loss``; a
distributed run adds ``compute_time`` and ``comm_time``. A loss that is not finite ends the
run (the lists end there).

Under torchrun, with DDP or FSDP2, checkpoints and exact resume::

    torchrun --standalone --nproc-per-node 2 -m distopt.train --parallel ddp --steps 20 \\
        --checkpoint-dir /tmp/ckpt [--resume]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from distopt.corpus import TokenData, loss_floor, markov_language
from distopt.gpt import GPT, GPTConfig, param_groups
from distopt.recipe import ADAMW_BETAS, CLIP_NORM, cosine_schedule

__all__ = [
    "DTYPES",
    "TrainConfig",
    "build_data",
    "empty_history",
    "evaluate",
    "lr_range_test",
    "main",
    "train",
    "train_step",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TrainConfig:
    """One training run: model, data, recipe."""

    model: GPTConfig = field(default_factory=GPTConfig)
    order: int = 2  # the language: each token depends on this many before it
    branching: int = 4  # possible successors of each context
    concentration: float = 1.0  # Dirichlet parameter of the successor probabilities
    language_seed: int = 0  # which random language
    train_tokens: int = 1 << 18  # size of the training text (tokens)
    batch_size: int = 32  # sequences per step (over all ranks)
    steps: int = 200  # optimizer steps
    peak_lr: float = 3e-3  # AdamW learning rate after warm-up
    warmup_steps: int = 20  # linear warm-up
    final_ratio: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1  # on matrices only
    clip_norm: float | None = CLIP_NORM  # global gradient norm; None: no clipping
    dtype: str = "bfloat16"  # autocast dtype of forward and backward ("float32": none)
    eval_every: int = 20  # steps between validation losses (and at the last step)
    eval_batches: int = 4  # validation batches of batch_size sequences
    bad_batch_steps: tuple[int, ...] = ()  # these steps see bad_batch() (garbage)
    seed: int = 0  # initial weights and the order of the batches

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("batch_size", "steps", "eval_every", "eval_batches", "train_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"need 0 <= warmup_steps <= steps, got {self.warmup_steps}")
        if self.peak_lr <= 0 or self.weight_decay < 0:
            raise ValueError("need peak_lr > 0 and weight_decay >= 0")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {self.clip_norm!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len

    def lr_at(self, step: int) -> float:
        """The schedule: warm-up, then cosine to ``final_ratio * peak_lr``."""
        return cosine_schedule(
            step,
            peak_lr=self.peak_lr,
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            final_ratio=self.final_ratio,
        )

    def floor(self) -> float:
        """The lowest reachable validation loss (nats/token), ``corpus.loss_floor``."""
        return loss_floor(_language(self), self.model.seq_len)


def _language(config: TrainConfig):
    return markov_language(
        config.model.vocab_size,
        order=config.order,
        branching=config.branching,
        concentration=config.concentration,
        seed=config.language_seed,
    )


@functools.lru_cache(maxsize=8)
def _cached_data(
    vocab_size: int,
    seq_len: int,
    order: int,
    branching: int,
    concentration: float,
    language_seed: int,
    train_tokens: int,
) -> TokenData:
    language = markov_language(
        vocab_size,
        order=order,
        branching=branching,
        concentration=concentration,
        seed=language_seed,
    )
    return TokenData(language, seq_len, train_tokens=train_tokens, seed=language_seed)


def build_data(config: TrainConfig) -> TokenData:
    """The run's training and validation text (cached: searches and sweeps reuse it)."""
    return _cached_data(
        config.model.vocab_size,
        config.model.seq_len,
        config.order,
        config.branching,
        config.concentration,
        config.language_seed,
        config.train_tokens,
    )


def empty_history() -> dict[str, list]:
    keys = ("step", "loss", "grad_norm", "lr", "step_time", "val_step", "val_loss")
    return {key: [] for key in keys}


def _log(history: dict[str, list], **values: float) -> None:
    for key, value in values.items():
        history[key].append(value)


def _autocast(dtype: str, device_type: str = "cpu"):
    return torch.autocast(device_type, dtype=DTYPES[dtype], enabled=dtype != "float32")


def batch_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of a (batch, seq + 1) block; logits in float32."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    *,
    lr: float,
    clip_norm: float | None,
    dtype: str,
    all_reduce: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """One AdamW step on ``tokens``; returns (loss, gradient norm before clipping).

    ``all_reduce``, if given, is called between backward and the optimizer step (a data-
    parallel run averages the gradients there).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    optimizer.zero_grad(set_to_none=True)
    with _autocast(dtype, tokens.device.type):
        loss = batch_loss(model, tokens)
    loss.backward()
    if all_reduce is not None:
        all_reduce()
    params = [p for p in model.parameters() if p.grad is not None]
    # clip_grad_norm_ returns the norm before clipping; with FSDP2 it reduces over the shards
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf)
    if hasattr(norm, "full_tensor"):  # a DTensor (FSDP2)
        norm = norm.full_tensor()
    optimizer.step()
    return loss.item(), float(norm)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[torch.Tensor], dtype: str) -> float:
    """Mean loss over fixed validation batches (nats/token)."""
    with _autocast(dtype):
        return sum(batch_loss(model, b).item() for b in batches) / len(batches)


class _Progress:
    """A one-line progress bar on stdout, redrawn at most every ``every_s`` seconds."""

    def __init__(self, total: int, enabled: bool, every_s: float = 0.25) -> None:
        self.total, self.enabled, self.every_s = total, enabled, every_s
        self.start = self.last = time.perf_counter()

    def update(self, done: int, loss: float, tokens: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < self.every_s and not force):
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total)
        rate = tokens / max(now - self.start, 1e-9)
        print(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} steps  "
            f"loss {loss:.3f}  {rate:,.0f} tokens/s  {now - self.start:.1f} s",
            end="" if done < self.total else "\n",
            flush=True,
        )


def make_model(config: TrainConfig) -> GPT:
    torch.manual_seed(config.seed)
    return GPT(config.model)


def make_optimizer(model: GPT, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``gpt.param_groups`` (the recipe's decay split, μP's rates when enabled)."""
    groups = param_groups(model, lr=config.peak_lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=ADAMW_BETAS, weight_decay=0.0)


def bad_batch(config: TrainConfig, step: int) -> torch.Tensor:
    """A corrupted batch: uniform random tokens (a shard of garbage, e.g. binary data that
    went through the tokenizer), seeded by the step. A model that has learnt the language
    predicts each token's few successors confidently, so its loss here is far above the
    running average, and the gradient pulls hard the wrong way."""
    gen = torch.Generator().manual_seed(10_000 + step)
    shape = (config.batch_size, config.model.seq_len + 1)
    return torch.randint(0, config.model.vocab_size, shape, generator=gen)


def train(
    config: TrainConfig,
    *,
    progress: bool = False,
    lr_at: Callable[[int], float] | None = None,
    stop_loss: float | None = None,
) -> tuple[GPT, dict[str, list]]:
    """Train a fresh model; returns it and its history.

    ``lr_at`` replaces the schedule (the learning-rate range test uses an exponential ramp);
    ``stop_loss`` ends the run once the training loss exceeds it. Deterministic for a given
    config and ``torch.get_num_threads()``.
    """
    data = build_data(config)
    val_batches = data.val_batches(config.eval_batches, config.batch_size)
    model = make_model(config)
    optimizer = make_optimizer(model, config)
    schedule = lr_at or config.lr_at
    history = empty_history()
    bar = _Progress(config.steps, progress)
    for step in range(config.steps):
        start = time.perf_counter()
        if step in config.bad_batch_steps:
            tokens = bad_batch(config, step)
        else:
            tokens = data.batch(step, config.batch_size)
        lr = schedule(step)
        loss, grad_norm = train_step(
            model, optimizer, tokens, lr=lr, clip_norm=config.clip_norm, dtype=config.dtype
        )
        _log(
            history,
            step=step,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            step_time=time.perf_counter() - start,
        )
        if not math.isfinite(loss) or (stop_loss is not None and loss > stop_loss):
            break
        bar.update(
            step + 1, loss, (step + 1) * config.tokens_per_step, force=step + 1 == config.steps
        )
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            history["val_step"].append(step)
            history["val_loss"].append(evaluate(model, val_batches, config.dtype))
    if progress and len(history["step"]) < config.steps:
        print()  # the bar ends its line only when it reaches the last step
    return model, history


def lr_range_test(
    config: TrainConfig, *, min_lr: float = 1e-5, max_lr: float = 1.0, steps: int = 100
) -> dict[str, list]:
    """Smith 2017's learning-rate range test: the rate grows exponentially from ``min_lr`` to
    ``max_lr`` over ``steps`` steps of one run; stops once the loss exceeds 1.5 x its start.

    Returns the history; plot ``loss`` against ``lr``. A good peak rate is somewhat below the
    rate at which the loss falls fastest, well below where it turns up.
    """
    if not 0 < min_lr < max_lr or steps < 2:
        raise ValueError("need 0 < min_lr < max_lr and steps >= 2")
    ratio = max_lr / min_lr
    cfg = replace(config, steps=steps, warmup_steps=0, eval_every=steps)
    initial = math.log(config.model.vocab_size)
    return train(
        cfg, lr_at=lambda step: min_lr * ratio ** (step / (steps - 1)), stop_loss=1.5 * initial
    )[1]


# --------------------------------------------------------------------------------------
# Data parallel: a launch worker with compute and communication timed apart, and torchrun.


def ddp_no_overlap(rank: int, world_size: int, config: TrainConfig) -> dict[str, list]:
    """Data-parallel training with the all-reduce *after* backward, one message per
    parameter tensor, nothing overlapped (a ``distopt.launch`` worker).

    Each rank computes the gradient of its ``batch_size / world_size`` sequences, then the
    gradients are averaged tensor by tensor with ``dist.all_reduce``, then every rank takes
    the same AdamW step. The history adds ``compute_time`` (forward, backward, optimizer, s)
    and ``comm_time`` (the all-reduces, s, waiting for the slower rank included) per step;
    ``step_time`` is their sum. DDP proper would bucket the gradients and overlap the
    all-reduces with the backward pass (section 01).
    """
    import torch.distributed as dist

    if config.batch_size % world_size:
        raise ValueError(f"batch_size {config.batch_size} must divide by {world_size} ranks")
    share = config.batch_size // world_size
    data = build_data(config)
    model = make_model(config)
    optimizer = make_optimizer(model, config)
    history = empty_history()
    history.update(compute_time=[], comm_time=[])
    comm_s = 0.0

    def all_reduce() -> None:
        nonlocal comm_s
        start = time.perf_counter()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
        comm_s = time.perf_counter() - start

    for step in range(config.steps):
        tokens = data.batch(step, config.batch_size)[rank * share : (rank + 1) * share]
        lr = config.lr_at(step)
        start = time.perf_counter()
        loss, grad_norm = train_step(
            model,
            optimizer,
            tokens,
            lr=lr,
            clip_norm=config.clip_norm,
            dtype=config.dtype,
            all_reduce=all_reduce,
        )
        total_s = time.perf_counter() - start
        mean_loss = torch.tensor([loss / world_size])
        dist.all_reduce(mean_loss)
        _log(
            history,
            step=step,
            loss=mean_loss.item(),
            grad_norm=grad_norm,
            lr=lr,
            step_time=total_s,
            compute_time=total_s - comm_s,
            comm_time=comm_s,
        )
    return history


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="torchrun --standalone --nproc-per-node N -m distopt.train",
        description="Train the small GPT data-parallel with DDP or FSDP2 (gloo on CPU, NCCL on "
        "GPUs), with checkpoints that resume exactly.",
    )
    parser.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--steps", type=int, default=50, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences/step, all ranks")
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
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "d_model", "n_layer", "seq_len", "log_every"):
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
            "-m distopt.train --parallel ddp --steps 20"
        )
    if args.batch_size % world_size:
        parser.error(f"--batch-size {args.batch_size} must divide by {world_size} processes")
    if args.d_model % 4:
        parser.error(f"--d-model must divide by the 4 attention heads, got {args.d_model}")
    return args


def _save(directory: Path, model: nn.Module, optimizer, step: int, history: dict) -> None:
    """Distributed checkpoint (each rank writes its shards) plus a small meta.json.

    ``step``: the next step to run, which is also the data position (batches are drawn by
    step number). meta.json is written last, by rank 0, so it names a complete checkpoint.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    name = f"step-{step:06d}"  # a new folder each time: never half-overwrite the last good one
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory / name)
    dist.barrier()
    if dist.get_rank() == 0:
        meta = {"step": step, "data_position": step, "state": name, "history": history}
        (directory / "meta.json.tmp").write_text(json.dumps(meta))
        (directory / "meta.json.tmp").replace(directory / "meta.json")
    dist.barrier()


def _load(directory: Path, model: nn.Module, optimizer) -> tuple[int, dict]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = json.loads((directory / "meta.json").read_text())
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory / meta["state"])
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return meta["data_position"], meta["history"]


def _auto_dtype(use_cuda: bool) -> str:
    """bfloat16 where it is native (a CUDA GPU with bf16, a CPU that computes it fast), else
    float32. On CPU rank 0 measures (``distopt.machine``) and tells the others, so that every
    rank computes in the same format."""
    import torch.distributed as dist

    from distopt.machine import autocast_dtype

    if use_cuda:
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    native = dist.get_rank() == 0 and autocast_dtype() == "bfloat16"
    choice = torch.tensor([int(native)])
    dist.broadcast(choice, src=0)
    return "bfloat16" if choice.item() else "float32"


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point (see the module docstring and ``--help``)."""
    args = _parse_args(argv)
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # ranks share the cores
    config = TrainConfig(
        model=GPTConfig(
            vocab_size=16, seq_len=args.seq_len, n_layer=args.n_layer, d_model=args.d_model
        ),
        batch_size=args.batch_size,
        steps=args.steps,
        peak_lr=args.peak_lr,
        warmup_steps=max(1, args.steps // 10),
        dtype=_auto_dtype(use_cuda) if args.dtype == "auto" else args.dtype,
        seed=args.seed,
    )
    model = make_model(config).to(device)
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device] if use_cuda else None)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    optimizer = make_optimizer(model, config)
    start, history = 0, empty_history()
    if args.resume:
        start, history = _load(args.checkpoint_dir, model, optimizer)
    if args.checkpoint_dir and rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    stop = args.stop_after or args.steps
    share = config.batch_size // world_size
    data = build_data(config)
    for step in range(start, stop):
        begin = time.perf_counter()
        batch = data.batch(step, config.batch_size)[rank * share : (rank + 1) * share]
        lr = config.lr_at(step)
        loss, grad_norm = train_step(
            wrapped,
            optimizer,
            batch.to(device),
            lr=lr,
            clip_norm=config.clip_norm,
            dtype=config.dtype,
        )
        mean_loss = torch.tensor([loss / world_size], device=device)
        dist.all_reduce(mean_loss)
        _log(
            history,
            step=step,
            loss=mean_loss.item(),
            grad_norm=grad_norm,
            lr=lr,
            step_time=time.perf_counter() - begin,
        )
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == stop):
            print(f"step {step + 1}/{args.steps}  loss {history['loss'][-1]:.4f}", flush=True)
        done = step + 1 == stop
        if args.checkpoint_dir and (
            done or (args.checkpoint_every and (step + 1) % args.checkpoint_every == 0)
        ):
            _save(args.checkpoint_dir, model, optimizer, step + 1, history)
    if rank == 0:
        where = f"; checkpoint in {args.checkpoint_dir}" if args.checkpoint_dir else ""
        print(
            f"{args.parallel} on {world_size} ranks, {config.dtype} compute: stopped after "
            f"step {stop}{where}"
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
