"""The one training loop of the course's small GPT, with the lesson's recipe.

The recipe (``distopt.optim.recipe``): AdamW with betas (0.9, 0.95), weight decay on
matrices only, linear warm-up then cosine decay to 10 % of the peak, gradient clipping at
global norm 1.0, the forward and backward passes under bfloat16 autocast while the weights,
gradients and Adam state stay float32 ("master weights", Micikevicius et al. 2018; on
bfloat16 no loss scaling is needed, its exponent range is float32's).

:func:`run_steps` is the loop. Everything that trains the GPT calls it: :func:`train` (one
process, in the notebook), the data-parallel workers of ``distopt.ranks.gpt_ddp_ranks`` (by
hand, DDP, FSDP2) and the ``torchrun`` entry point ``distopt.project.train``; they differ only
in the batches each rank sees, in how gradients and losses are averaged over ranks, and in
what happens after a step (checkpoints). Gradient accumulation is one setting,
``TrainConfig.micro_batches``: each rank's share of a step is cut into that many
micro-batches, whose gradients add up before the one optimizer step (section 01), so that
``micro_batch x micro_batches x world_size = batch_size``. In one process::

    from distopt.project.loop import TrainConfig, train
    model, history = train(TrainConfig(steps=200))

``history`` is the course's training log (``distopt.project.history``). A loss that is not
finite ends the run (the lists end there).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from distopt.optim.recipe import ADAMW_BETAS, CLIP_NORM, cosine_schedule
from distopt.problems.corpus import TokenData, loss_floor, markov_language
from distopt.project.gpt import GPT, GPTConfig, param_groups
from distopt.project.history import empty_history, log

__all__ = [
    "DTYPES",
    "TrainConfig",
    "batch_at",
    "build_data",
    "evaluate",
    "make_model",
    "make_optimizer",
    "mean_over_ranks",
    "run_steps",
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
    batch_size: int = 32  # sequences per step (over all ranks and micro-batches)
    micro_batches: int = 1  # gradient accumulation: backward passes per rank and step
    steps: int = 200  # optimizer steps
    peak_lr: float = 3e-3  # AdamW learning rate after warm-up
    warmup_steps: int = 20  # linear warm-up
    final_ratio: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1  # on matrices only
    clip_norm: float | None = CLIP_NORM  # global gradient norm; None: no clipping
    dtype: str = "bfloat16"  # autocast dtype of forward and backward ("float32": none)
    eval_every: int = 20  # steps between validation losses (and at the last step)
    eval_batches: int = 4  # validation batches of batch_size sequences
    # the loss is multiplied by this before backward and the gradients divided by it after:
    # the same update, with gradients as small as a large model's (float16's range, Part C)
    loss_multiplier: float = 1.0
    loss_scaling: bool = False  # float16's dynamic loss scaling (torch.amp.GradScaler)
    seed: int = 0  # initial weights and the order of the batches
    # z-loss (PaLM; Wortsman et al. 2023): this times the mean of log(Z)^2, Z the softmax's
    # normaliser, is added to the loss that is differentiated (the logged loss stays the
    # cross-entropy): it pulls the output logits' log-normaliser towards 0
    z_loss: float = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in (
            "batch_size", "micro_batches", "steps", "eval_every", "eval_batches", "train_tokens",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"need 0 <= warmup_steps <= steps, got {self.warmup_steps}")
        if self.peak_lr <= 0 or self.weight_decay < 0:
            raise ValueError("need peak_lr > 0 and weight_decay >= 0")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {self.clip_norm!r}")
        if self.z_loss < 0:
            raise ValueError(f"z_loss must be >= 0, got {self.z_loss!r}")
        if not self.loss_multiplier > 0:
            raise ValueError(f"loss_multiplier must be > 0, got {self.loss_multiplier!r}")

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


def _autocast(dtype: str, device_type: str = "cpu"):
    return torch.autocast(device_type, dtype=DTYPES[dtype], enabled=dtype != "float32")


def batch_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of a (batch, seq + 1) block; logits in float32."""
    return _losses(model, tokens)[0]


def _losses(
    model: nn.Module, tokens: torch.Tensor, z_loss: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean cross-entropy, mean log(Z)^2 over the positions if ``z_loss`` else None)."""
    logits = model(tokens[:, :-1]).flatten(0, 1).float()
    cross_entropy = F.cross_entropy(logits, tokens[:, 1:].flatten())
    return cross_entropy, torch.logsumexp(logits, dim=-1).square().mean() if z_loss else None


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    *,
    lr: float,
    clip_norm: float | None,
    dtype: str,
    sync: Callable[[], float] | None = None,
    loss_multiplier: float = 1.0,
    scaler: torch.amp.GradScaler | None = None,
    micro_batches: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
    z_loss: float = 0.0,
) -> tuple[float, float, float]:
    """One AdamW step on ``tokens``; returns (loss, gradient norm before clipping, seconds
    spent in ``sync``).

    ``tokens`` is cut into ``micro_batches`` equal micro-batches, each run forward and
    backward with its loss divided by ``micro_batches``: the gradients add up in ``.grad``
    to those of the whole block's mean loss (gradient accumulation), and the logged loss is
    the micro-batches' mean. ``no_sync``, if given, is a wrapper's switch that keeps it from
    communicating (``DistributedDataParallel.no_sync``): it is on for every micro-batch but
    the last, so the gradients cross the network once per step. ``sync``, if given, is
    called between the last backward and the optimizer step (a data-parallel run by hand
    averages the gradients there) and returns the seconds it spent communicating.
    ``loss_multiplier`` shrinks the gradients the backward pass computes (they are divided
    by it again before clipping); ``scaler`` scales the loss up before backward and skips a
    step whose gradients overflowed (float16). ``z_loss`` (``TrainConfig.z_loss``) adds that
    times the mean log(Z)^2 to the loss differentiated, not to the loss returned.
    """
    if micro_batches < 1 or tokens.shape[0] % micro_batches:
        raise ValueError(
            f"{tokens.shape[0]} sequences do not cut into {micro_batches} micro-batches"
        )
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for k, micro_batch in enumerate(tokens.chunk(micro_batches)):
        quiet = no_sync is not None and k < micro_batches - 1
        with no_sync() if quiet else contextlib.nullcontext():
            with _autocast(dtype, tokens.device.type):
                loss, log_z_squared = _losses(model, micro_batch, z_loss=z_loss > 0)
            objective = loss if log_z_squared is None else loss + z_loss * log_z_squared
            backward_loss = objective * (loss_multiplier / micro_batches)
            (scaler.scale(backward_loss) if scaler is not None else backward_loss).backward()
        loss_sum += loss.item()
    comm_s = sync() if sync is not None else 0.0
    params = [p for p in model.parameters() if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)
    if loss_multiplier != 1.0:
        torch._foreach_div_([p.grad for p in params], loss_multiplier)
    # clip_grad_norm_ returns the norm before clipping; with FSDP2 it reduces over the shards
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf)
    if hasattr(norm, "full_tensor"):  # a DTensor (FSDP2)
        norm = norm.full_tensor()
    if scaler is not None:
        scaler.step(optimizer)  # skipped if a gradient is not finite
        scaler.update()
    else:
        optimizer.step()
    return loss_sum / micro_batches, float(norm), comm_s


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[torch.Tensor], dtype: str) -> float:
    """Mean loss over fixed validation batches (nats/token)."""
    with _autocast(dtype):
        return sum(batch_loss(model, b).item() for b in batches) / len(batches)


def make_model(config: TrainConfig) -> GPT:
    torch.manual_seed(config.seed)
    return GPT(config.model)


def make_optimizer(model: GPT, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``gpt.param_groups`` (the recipe's decay split, μP's rates when enabled)."""
    groups = param_groups(model, lr=config.peak_lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=ADAMW_BETAS, weight_decay=0.0)


def batch_at(
    config: TrainConfig, *, rank: int = 0, world_size: int = 1
) -> Callable[[int], torch.Tensor]:
    """The batch a rank trains on at each step: its ``1/world_size`` share of the global
    batch (drawn by step number, so a resumed run sees the same data); ``train_step`` cuts
    it into ``config.micro_batches`` micro-batches."""
    if config.batch_size % (world_size * config.micro_batches):
        raise ValueError(
            f"batch_size {config.batch_size} must divide by {world_size} ranks x "
            f"{config.micro_batches} micro-batches"
        )
    share = config.batch_size // world_size
    data = build_data(config)

    def at(step: int) -> torch.Tensor:
        tokens = data.batch(step, config.batch_size)
        return tokens[rank * share : (rank + 1) * share]

    return at


def run_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    batches: Callable[[int], torch.Tensor],
    *,
    start: int = 0,
    stop: int | None = None,
    history: dict[str, list] | None = None,
    lr_at: Callable[[int], float] | None = None,
    stop_loss: float | None = None,
    sync: Callable[[], float] | None = None,
    mean_over_ranks: Callable[[float], float] | None = None,
    val_batches: list[torch.Tensor] | None = None,
    after_step: Callable[[int, dict], None] | None = None,
    no_sync: Callable[[], AbstractContextManager] | None = None,
    progress: bool = False,
) -> dict[str, list]:
    """Steps ``start`` .. ``stop - 1`` (default: to ``config.steps``); returns the history.

    batches         -- step -> this rank's tokens (``batch_at``)
    lr_at           -- replaces the schedule ``config.lr_at`` (the range test's ramp)
    stop_loss       -- end the run once the training loss exceeds it
    sync            -- called between backward and the optimizer step (averaging gradients
                       by hand); returns the seconds it spent, logged as ``comm_time``
    mean_over_ranks -- the logged loss is this of the rank's loss (an all-reduce)
    val_batches     -- evaluated every ``config.eval_every`` steps and at the last step
    after_step      -- called with (step, history) after each step (checkpoints, logs)
    no_sync         -- the wrapper's switch that holds its gradient communication back, on
                       for every micro-batch but the last (``train_step``)
    progress        -- a progress bar (tqdm) on stdout
    """
    history = empty_history(timed=sync is not None) if history is None else history
    schedule = lr_at or config.lr_at
    stop = config.steps if stop is None else stop
    bar = tqdm(
        total=stop - start, desc="training", unit="step", disable=not progress,
        file=sys.stdout, mininterval=1.0,
    )  # fmt: skip
    scaler = torch.amp.GradScaler("cpu") if config.loss_scaling else None
    for step in range(start, stop):
        tokens, lr = batches(step), schedule(step)
        begin = time.perf_counter()
        loss, grad_norm, comm_s = train_step(
            model, optimizer, tokens, lr=lr, clip_norm=config.clip_norm, dtype=config.dtype,
            sync=sync, loss_multiplier=config.loss_multiplier, scaler=scaler,
            micro_batches=config.micro_batches, no_sync=no_sync, z_loss=config.z_loss,
        )  # fmt: skip
        step_s = time.perf_counter() - begin
        if mean_over_ranks is not None:
            loss = mean_over_ranks(loss)
        log(history, step=step, loss=loss, grad_norm=grad_norm, lr=lr, step_time=step_s)
        if sync is not None:
            log(history, compute_time=step_s - comm_s, comm_time=comm_s)
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if not math.isfinite(loss) or (stop_loss is not None and loss > stop_loss):
            break
        if val_batches is not None and ((step + 1) % config.eval_every == 0 or step + 1 == stop):
            log(history, val_step=step, val_loss=evaluate(model, val_batches, config.dtype))
        if after_step is not None:
            after_step(step, history)
    bar.close()
    return history


def mean_over_ranks(loss: float, device: torch.device | str = "cpu") -> float:
    """The mean of ``loss`` over the ranks of the default process group (an all-reduce)."""
    total = torch.tensor([loss / dist.get_world_size()], device=device)
    dist.all_reduce(total)
    return total.item()


def train(
    config: TrainConfig,
    *,
    progress: bool = False,
    lr_at: Callable[[int], float] | None = None,
    stop_loss: float | None = None,
) -> tuple[GPT, dict[str, list]]:
    """Train a fresh model in this process; returns it and its history.

    Deterministic for a given config, machine and ``torch.get_num_threads()``.
    """
    val_batches = build_data(config).val_batches(config.eval_batches, config.batch_size)
    model = make_model(config)
    optimizer = make_optimizer(model, config)
    history = run_steps(
        model, optimizer, config, batch_at(config), lr_at=lr_at, stop_loss=stop_loss,
        val_batches=val_batches, progress=progress,
    )  # fmt: skip
    return model, history
