"""Activation checkpointing, measured: a transformer block, the bytes autograd saves for its
backward pass and the FLOPs recomputation adds (which blocks to checkpoint within a budget
is section 02's exercise: the package holds no answer to it, only the greedy rule of thumb).

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.1) count what one transformer layer stores for backward, with sequence length s,
micro-batch b, hidden size h and a heads, 16-bit activations and 1-byte dropout masks:
34 sbh + 5 a s^2 b bytes. :class:`TransformerBlock` is built so that PyTorch saves exactly
the tensors of that count, and :class:`SavedBytes` counts them::

    blocks = build_blocks(hidden=64, layout=[(4, 256)] * 2, seed=0)
    x = block_input(seq_len=64, micro_batch=2, hidden=64, seed=1)
    with SavedBytes(ignore=blocks.parameters()) as saved:
        y = blocks[1](blocks[0](x))
    saved.bytes        # what the graph holds for backward now, deduplicated by storage

What PyTorch adds to the paper's count is LayerNorm's two statistics per token (its mean and
1/std, in the activations' dtype on a CPU): 2 x 2 x sb bytes per norm, 8 sb per block.

The count cannot be shadowed: saved-tensor hooks are a stack, and hooks pushed inside the
block (``torch.autograd.graph.saved_tensors_hooks``) would take the saved tensors out of the
count while autograd still held them. :class:`SavedBytes` watches every operator run inside
it and names, in :attr:`SavedBytes.foreign_hooks`, any pack hook on top of the stack that is
neither its own nor ``torch.utils.checkpoint``'s.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "SavedBytes",
    "TransformerBlock",
    "block_input",
    "build_blocks",
    "greedy_checkpoints",
    "hand_checkpoint",
    "matmul_flops",
    "measure_blocks",
]


class TransformerBlock(nn.Module):
    """A pre-norm transformer layer as Korthikanti et al. count it; input and output (s, b, h).

    x + dropout(proj(attention(LN1(x)))), then + dropout(fc2(GELU(fc1(LN2(.))))), with
    dropout on the attention probabilities too, no attention mask. Every choice keeps the
    saved tensors those of the paper's count:

    * Q, K and V come from one Linear and are each copied into (b a, s, h/a) for the batched
      products: each product saves its own 16-bit operands (Q and K, then the dropped-out
      probabilities and V), 6 sbh in all;
    * dropout is ``torch.native_dropout``, the fused kernel that ``F.dropout`` runs on a GPU,
      which saves a 1-byte mask. On a CPU ``F.dropout`` multiplies by a noise tensor of the
      input's dtype instead and saves that, 2 bytes per element (``mask_dropout=False``
      builds that variant, to measure the difference);
    * ``selective=True`` runs the attention core (scores, softmax, dropout, times V) under
      ``torch.utils.checkpoint``: Korthikanti's selective recomputation, which keeps Q, K, V
      and drops the 5 a s^2 b bytes of the scores.
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int | None = None,
        *,
        dropout: float = 0.1,
        selective: bool = False,
        mask_dropout: bool = True,
    ) -> None:
        super().__init__()
        if hidden < 1 or heads < 1 or hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a positive multiple of heads ({heads})")
        if not 0 < dropout < 1:
            raise ValueError(
                f"dropout must be in (0, 1): it is what saves the masks, got {dropout}"
            )
        self.hidden, self.heads = hidden, heads
        self.ffn = 4 * hidden if ffn is None else ffn  # the MLP's inner width (4h in the paper)
        self.dropout, self.selective, self.mask_dropout = dropout, selective, mask_dropout
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, self.ffn)
        self.fc2 = nn.Linear(self.ffn, hidden)

    def drop(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask_dropout:
            return torch.native_dropout(x, self.dropout, True)[0]
        return F.dropout(x, self.dropout, training=True)

    def attention_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(Q K^T / sqrt(d)) V with dropout on the probabilities; (b a, s, d) each."""
        # Scaling by a Python number saves nothing, so the scores themselves are not kept.
        scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.bmm(self.drop(torch.softmax(scores, dim=-1)), v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        a, d = self.heads, h // self.heads

        def split_heads(t: torch.Tensor) -> torch.Tensor:  # (s, b, h) -> (b a, s, d), a copy
            return t.reshape(s, b * a, d).transpose(0, 1).contiguous()

        q, k, v = (split_heads(t) for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        if self.selective:
            context = checkpoint(self.attention_core, q, k, v, use_reentrant=False)
        else:
            context = self.attention_core(q, k, v)
        context = context.transpose(0, 1).reshape(s, b, h)
        x = x + self.drop(self.proj(context))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def build_blocks(
    hidden: int,
    layout: Sequence[tuple[int, int]],
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    **block_options: Any,
) -> nn.ModuleList:
    """Blocks of width ``hidden``, one per ``(heads, ffn)`` of ``layout``, in ``dtype``.

    The weights depend only on ``seed`` and the shapes (a local generator: the global RNG
    is neither read nor moved). ``block_options`` go to every :class:`TransformerBlock`.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = [TransformerBlock(hidden, heads, ffn, **block_options) for heads, ffn in layout]
    return nn.ModuleList(blocks).to(dtype)


def block_input(
    seq_len: int, micro_batch: int, hidden: int, *, seed: int = 0, dtype=torch.bfloat16
) -> torch.Tensor:
    """A seeded (s, b, h) input that requires grad, as a layer's input inside a model does."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(seq_len, micro_batch, hidden, generator=generator, dtype=torch.float32)
    return x.to(dtype).requires_grad_(True)


class _Held:
    """What the pack hook hands autograd: the saved tensor, in an object that can be weakly
    referenced, so that the counter sees when autograd lets go of it."""

    __slots__ = ("tensor", "order", "__weakref__")

    def __init__(self, tensor: torch.Tensor, order: int) -> None:
        self.tensor = tensor
        self.order = order  # how many tensors were packed before it


class SavedBytes:
    """Count the bytes that autograd holds for the backward pass of what runs inside.

    ``with SavedBytes(ignore=model.parameters()) as saved: y = model(x)``, then ``saved.bytes``.
    Every tensor an operation saves for backward passes through a pack hook
    (``torch.autograd.graph.saved_tensors_hooks``). How they are counted:

    * by storage: a storage counts once, however many tensors were saved from it (the same
      tensor saved by two operations, views of it), and whole (a saved view keeps all of its
      storage alive);
    * only while autograd still holds a tensor of it: a graph that was dropped or has run its
      backward counts 0;
    * the storages of ``ignore`` are left out: parameters are weights, not activations.

    A ``torch.utils.checkpoint`` region installs hooks of its own inside, so what it keeps is
    what reaches these: its inputs. Any other pack hook that an operator inside runs under
    (code that pushed ``saved_tensors_hooks`` of its own, which would keep tensors out of
    this count) is named in :attr:`foreign_hooks`, seen by a ``TorchDispatchMode``.
    """

    def __init__(self, ignore: Iterable[torch.Tensor] = ()) -> None:
        self._ignored = {t.untyped_storage().data_ptr() for t in ignore}
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self.packed = 0  # tensors handed to the pack hook, repeats and parameters included
        self._hooks: Any = None
        self._watch: Any = None
        self._foreign: dict[str, None] = {}  # pack hooks of others, by name, in order seen

    def __enter__(self) -> SavedBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        self._watch = _watching_hooks(self._pack, self._foreign)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._watch.__exit__(*exc)
        self._hooks.__exit__(*exc)

    @property
    def foreign_hooks(self) -> list[str]:
        """The pack hooks other than this counter's and ``torch.utils.checkpoint``'s that
        operators inside ran under (``module.qualname``), in the order first seen."""
        return list(self._foreign)

    def _pack(self, tensor: torch.Tensor) -> _Held:
        held = _Held(tensor, self.packed)
        self._held.add(held)
        self.packed += 1
        return held

    def storages(self) -> list[tuple[tuple[int, ...], torch.dtype, int]]:
        """One row per counted storage: (shape, dtype) of the first tensor saved from it, and
        the storage's bytes; in the order the tensors were saved."""
        rows: dict[int, tuple[tuple[int, ...], torch.dtype, int]] = {}
        for held in sorted(self._held, key=lambda held: held.order):
            storage = held.tensor.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() == 0 or key in self._ignored or key in rows:
                continue
            rows[key] = (tuple(held.tensor.shape), held.tensor.dtype, storage.nbytes())
        return list(rows.values())

    @property
    def bytes(self) -> int:
        """Bytes of the storages autograd holds now (see the class's docstring)."""
        return sum(nbytes for _, _, nbytes in self.storages())


def _watching_hooks(own: Callable, foreign: dict[str, None]) -> Any:
    """A ``TorchDispatchMode`` that, at every operator, looks at the pack hook on top of
    autograd's stack of saved-tensor hooks and notes it in ``foreign`` unless it is ``own``
    or ``torch.utils.checkpoint``'s (its regions push hooks of their own)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    top = torch._C._autograd._top_saved_tensors_default_hooks

    class WatchingHooks(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            hooks = top(False)
            if hooks is not None and hooks[0] != own:  # a bound method: equal, not identical
                module = getattr(hooks[0], "__module__", None) or "?"
                if module != "torch.utils.checkpoint":
                    name = getattr(hooks[0], "__qualname__", type(hooks[0]).__name__)
                    foreign[f"{module}.{name}"] = None
            return func(*args, **(kwargs or {}))

    return WatchingHooks()


def _unpack(held: _Held) -> torch.Tensor:
    return held.tensor


class _Recompute(torch.autograd.Function):
    """Activation checkpointing by hand: keep only the block's input, rerun it in backward.

    forward runs the block without a graph and saves its input and the RNG state, so that
    the rerun draws the same dropout masks. The parameters are inputs too, so that the output
    requires grad even where ``x`` does not (a model's first block). backward reruns the
    block with a graph from the saved input and runs that graph's backward pass at once.
    """

    @staticmethod
    def forward(ctx, block: nn.Module, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.block = block
        ctx.rng_state = torch.get_rng_state()
        ctx.save_for_backward(x)
        ctx.num_params = len(params)
        return block(x)  # autograd.Function's forward runs without a graph

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.set_rng_state(ctx.rng_state)
            x_again = x.detach().requires_grad_(True)
            out = ctx.block(x_again)
        # backward(), not autograd.grad(): the parameters' gradients accumulate in .grad as
        # in a plain backward pass (and FlopCounterMode's module hooks refuse a nested grad()).
        torch.autograd.backward(out, grad_out)
        grad_x = x_again.grad if ctx.needs_input_grad[1] else None
        return None, grad_x, *([None] * ctx.num_params)


def hand_checkpoint(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``block(x)``, keeping only ``x`` for backward and rerunning the block there."""
    return _Recompute.apply(block, x, *block.parameters())


def matmul_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the matrix products ``fn()`` runs, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add; elementwise work is not
    counted). Deterministic: the count follows from the shapes alone."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def measure_blocks(
    blocks: Sequence[nn.Module], x: torch.Tensor
) -> tuple[list[int], list[int], list[int]]:
    """Each block's figures on inputs shaped like ``x``, measured one block at a time:

    * the bytes it saves for backward as it is (:class:`SavedBytes`, parameters left out),
    * the bytes it keeps under ``torch.utils.checkpoint`` (its input),
    * the FLOPs of its forward pass, what checkpointing it adds to a step
      (:func:`matmul_flops`).

    In a stack the blocks' figures add up: a block's input is the previous block's output,
    a new tensor that only the block itself saves.
    """
    parameters = [p for block in blocks for p in block.parameters()]
    saved, kept, flops = [], [], []
    for block in blocks:
        block_x = x.detach().requires_grad_(True)
        with torch.random.fork_rng(devices=[]):  # dropout must not move the caller's RNG
            with SavedBytes(ignore=parameters) as plain:
                out = block(block_x)
            saved.append(plain.bytes)
            del out
            with SavedBytes(ignore=parameters) as checkpointed:
                out = checkpoint(block, block_x, use_reentrant=False)
            kept.append(checkpointed.bytes)
            del out
            flops.append(matmul_flops(functools.partial(block, block_x)))
    return saved, kept, flops


def _check_plan(
    saved_bytes: Sequence[int], kept_bytes: Sequence[int], recompute_flops: Sequence[int]
) -> int:
    n = len(saved_bytes)
    if len(kept_bytes) != n or len(recompute_flops) != n:
        raise ValueError("saved_bytes, kept_bytes and recompute_flops need one entry per block")
    if n > 20:
        raise ValueError(f"an exact search over 2^{n} subsets: at most 20 blocks")
    return n


def _plan_bytes(saved: Sequence[int], kept: Sequence[int], chosen: Iterable[int]) -> int:
    chosen = set(chosen)
    return sum(kept[i] if i in chosen else saved[i] for i in range(len(saved)))


def greedy_checkpoints(
    saved_bytes: Sequence[int],
    kept_bytes: Sequence[int],
    recompute_flops: Sequence[int],
    budget_bytes: int,
) -> tuple[int, ...] | None:
    """The rule of thumb: checkpoint the blocks that free the most bytes per recomputed FLOP
    first, until the rest fits. Not optimal: it can overshoot with a block that a single
    larger one would have replaced more cheaply."""
    n = _check_plan(saved_bytes, kept_bytes, recompute_flops)
    order = sorted(range(n), key=lambda i: -(saved_bytes[i] - kept_bytes[i]) / recompute_flops[i])
    chosen: list[int] = []
    for i in [None, *order]:
        if i is not None:
            chosen.append(i)
        if _plan_bytes(saved_bytes, kept_bytes, chosen) <= budget_bytes:
            return tuple(sorted(chosen))
    return None
