"""A small decoder-only transformer (GPT) in one file, for the training project.

The architecture of GPT-2 (Radford et al. 2019) as nanoGPT writes it: token and learned
position embeddings, ``n_layer`` pre-norm blocks (LayerNorm, causal multi-head
self-attention, LayerNorm, a GELU MLP of width ``mlp_ratio * d_model``, each with a residual
connection), a final LayerNorm and an untied linear read-out to the vocabulary.

``GPTConfig.norm_placement = "post"`` builds the original Transformer's blocks instead
(Vaswani et al. 2017: the LayerNorm *after* each residual addition), for section 07's
contrast: without warm-up their gradients near the output are large at the start and a high
rate throws training off (Xiong et al. 2020), where the pre-norm blocks train.

``GPTConfig.qk_norm`` adds *qk-layernorm* (Dehghani et al. 2023; Wortsman et al. 2023): a
LayerNorm over each head's queries and over its keys before their product, which caps an
attention logit at ``scale * d_head`` times the product of the two LayerNorms' largest gains
(at initialisation ``sqrt(d_head)``), however large the weights grow.
:func:`max_attention_logit` measures the largest attention logit a batch produces, the
quantity whose growth Wortsman et al. found behind small models' instability at high rates.

Two parameterisations (``GPTConfig.mup_base_width``):

* standard (``None``): every weight matrix is initialised with std ``1/sqrt(fan_in)``
  (the residual output projections additionally divided by ``sqrt(2 n_layer)``, as GPT-2
  does), one learning rate for all;
* μP (Yang et al. 2022, "Tensor Programs V", Table 3, the Adam column): with
  ``width_mult = d_model / mup_base_width``, the same initialisation, the logits multiplied
  by ``1 / width_mult`` (read-out initialised to zero), attention scores scaled by ``1/d_head``
  instead of ``1/sqrt(d_head)``, and the hidden matrices' Adam learning rate divided by
  ``width_mult`` (:func:`param_groups`). At ``d_model == mup_base_width`` both are the same
  model, so a learning rate tuned there carries over to wider models.

FLOPs are counted as Kaplan et al. 2020 (sec. 2.1) and Narayanan et al. 2021 (eq. 3) do:
only matrix multiplications, 2 FLOPs per multiply-add, backward = 2 x forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "GPTConfig", "flops_per_token", "max_attention_logit", "param_groups"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model."""

    vocab_size: int = 64  # tokens
    seq_len: int = 64  # context length, tokens
    n_layer: int = 2  # transformer blocks
    n_head: int = 4  # attention heads per block
    d_model: int = 128  # residual-stream width
    mlp_ratio: int = 4  # MLP hidden width / d_model
    mup_base_width: int | None = None  # None: standard parameterisation; else μP's base width
    norm_placement: str = "pre"  # "pre": LayerNorm inside each residual branch; "post": after it
    qk_norm: bool = False  # LayerNorm over each head's queries and keys (qk-layernorm)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} must divide by n_head {self.n_head}")
        if self.mup_base_width is not None and self.mup_base_width < 1:
            raise ValueError(f"mup_base_width must be >= 1 or None, got {self.mup_base_width}")
        if self.norm_placement not in ("pre", "post"):
            raise ValueError(f'norm_placement must be "pre" or "post", got {self.norm_placement!r}')

    @property
    def width_mult(self) -> float:
        """d_model / mup_base_width (1.0 under the standard parameterisation)."""
        return 1.0 if self.mup_base_width is None else self.d_model / self.mup_base_width


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        d_head = config.d_model // config.n_head
        # μP: 1/d_head keeps attention logits O(1) when q and k become correlated in training
        self.scale = 1 / d_head if config.mup_base_width is not None else 1 / math.sqrt(d_head)
        if config.qk_norm:
            self.q_norm, self.k_norm = nn.LayerNorm(d_head), nn.LayerNorm(d_head)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of ``x`` (batch, seq, width), each (batch, head, seq, d_head); q and k
        normalised under qk-layernorm."""
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.heads(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model)
        )
        self.post_norm = config.norm_placement == "post"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """``GPT(config)(tokens)``: int64 tokens (batch, seq) -> float logits (batch, seq, vocab)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The initialisation described in the module docstring (uses torch's global RNG)."""
        residual_std = 1 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if p.ndim == 1:
                gains = ("ln1.weight", "ln2.weight", "ln_f.weight", "_norm.weight")  # q_, k_
                p.fill_(1.0 if name.endswith(gains) else 0)
            elif name.endswith("emb.weight"):
                nn.init.normal_(p, std=1.0)
            elif name == "head.weight":
                if self.config.mup_base_width is None:
                    nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
                else:
                    p.zero_()
            else:
                std = 1 / math.sqrt(p.shape[1])
                if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                    std *= residual_std
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(f"sequence of {seq} tokens exceeds seq_len {self.config.seq_len}")
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(seq, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) / self.config.width_mult

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of a (batch, seq + 1) block of tokens."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


@torch.no_grad()
def max_attention_logit(model: GPT, tokens: torch.Tensor) -> float:
    """The largest attention logit ``scale * q . k`` (in absolute value, over every layer,
    head and causal query-key pair) the model computes on ``tokens`` (batch, seq)."""
    inputs: list[torch.Tensor] = []
    hooks = [
        block.attn.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
        for block in model.blocks
    ]
    try:
        model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    largest = 0.0
    for block, x in zip(model.blocks, inputs, strict=True):
        q, k, _ = block.attn.heads(x.float())
        logits = (q @ k.transpose(-2, -1)) * block.attn.scale
        causal = torch.ones(logits.shape[-2:], dtype=torch.bool).tril()
        largest = max(largest, float(logits.abs().masked_select(causal).max()))
    return largest


def param_groups(model: GPT, *, lr: float, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: the recipe's split, plus μP's learning rates.

    Matrices (``ndim >= 2``) are decayed, vectors (biases, LayerNorm gains) are not
    (``distopt.optim.recipe.adamw_param_groups``). Under μP the *hidden* matrices (both dimensions
    grow with width: attention and MLP weights) get ``lr / width_mult``; embeddings and the
    read-out (one dimension fixed by the vocabulary or the context) keep ``lr``
    (Yang et al. 2022, Table 3). Each group carries ``"lr_scale"``, its rate relative to the
    schedule's, so a training loop sets ``group["lr"] = lr_scale * schedule(step)``.
    """
    hidden_scale = 1 / model.config.width_mult
    groups = {
        "hidden": {"params": [], "weight_decay": weight_decay, "lr_scale": hidden_scale},
        "other_matrices": {"params": [], "weight_decay": weight_decay, "lr_scale": 1.0},
        "vectors": {"params": [], "weight_decay": 0.0, "lr_scale": 1.0},
    }
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2:
            groups["vectors"]["params"].append(p)
        elif name.startswith("blocks."):
            groups["hidden"]["params"].append(p)
        else:
            groups["other_matrices"]["params"].append(p)
    out = [g for g in groups.values() if g["params"]]
    for g in out:
        g["lr"] = lr * g["lr_scale"]
    return out


def flops_per_token(config: GPTConfig) -> float:
    """Training FLOPs per token (forward + backward), matrix multiplications only.

    Per layer the weight matrices hold ``(4 + 2 * mlp_ratio) d^2`` parameters; with the
    read-out's ``d V`` that is ``N`` multiply-add weights per token, costing ``2 N`` FLOPs
    forward and ``6 N`` forward + backward. Attention adds ``q k^T`` and ``a v``:
    ``2 * 2 * seq_len * d`` FLOPs per token and layer forward, ``12 n_layer seq_len d`` in all
    (Kaplan et al. 2020, Table 1; PaLM, Chowdhery et al. 2022, app. B). Causal masking is not
    subtracted (the usual convention). With ``mlp_ratio = 4`` this equals
    ``distopt.costs.transformer.training_flops(...) / (batch * seq_len)`` (Narayanan et al. eq. 3
    without recomputation).
    """
    d, n, s, v = config.d_model, config.n_layer, config.seq_len, config.vocab_size
    matmul_weights = n * (4 + 2 * config.mlp_ratio) * d * d + d * v
    return 6 * matmul_weights + 12 * n * s * d
