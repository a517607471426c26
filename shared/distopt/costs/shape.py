"""One description of a transformer and one of a parallel layout, for every cost model.

:class:`TransformerShape` is what the memory model (:mod:`distopt.costs.memory`), the planner
(:mod:`distopt.costs.planner`) and the explorers read about a model: its layers, widths, heads
(``kv_heads`` < ``heads`` for grouped-query attention), MLP kind ("gelu": two matrices,
h x f and f x h; "swiglu": three, gate, up and down), vocabulary, sequence length and whether
the input and output embeddings are one matrix. :class:`Layout` is how the model runs: tensor,
pipeline, data (and context, expert) degrees, the ZeRO stage, the micro-batch, activation
recomputation and FlashAttention.

Parameter counts:

* a GPT-style shape (GELU MLP of width 4h, biases and LayerNorms, tied embeddings, learned
  positions) counts Narayanan et al. 2021's equation (2) exactly,
  12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), which leaves out the final LayerNorm (2h);
* a Llama-style shape (``biases=False``: no biases, RMSNorm gains only, the final norm
  counted; ``learned_positions=False``: rotary positions, no parameters) counts every tensor of
  the published checkpoints: :data:`PRESETS`' Llama 3 8B, 70B and 405B give 8.03B, 70.6B and
  405.9B (Llama Team 2024, "The Llama 3 Herd of Models", Table 3); its Mixtral 8x7B (the same
  count, 8 SwiGLU experts and a router per layer) gives 46.7B, 12.9B of them active per token
  (Jiang et al. 2024, "Mixtral of Experts": 47B and 13B).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MLP_KINDS",
    "PRESETS",
    "RECOMPUTE_MODES",
    "Layout",
    "TransformerShape",
    "from_gpt_config",
    "param_count",
]

MLP_KINDS = ("gelu", "swiglu")
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer; the first five fields in the order the planner always took.

    ``kv_heads``: key/value heads (None: ``heads``, multi-head attention; fewer: grouped-query
    attention, each K/V head shared by heads/kv_heads query heads). ``ffn_hidden``: the MLP's
    inner width f (None: 4 h). ``experts`` > 0: a mixture of experts, every layer's MLP in
    ``experts`` copies plus an h x experts router, each token sent to ``top_k`` of them.
    ``params``: a stated parameter count used instead of the shape's (the lesson's round
    70e9), for models whose count is given rather than derived.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int  # tokens per sequence
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    mlp: str = "gelu"
    tied_embeddings: bool = True
    biases: bool = True  # linear biases and LayerNorm (GPT); False: none, RMSNorm (Llama)
    learned_positions: bool = True  # a learned s x h position table (GPT); False: rotary
    experts: int = 0  # 0: a dense MLP
    top_k: int = 1
    params: float | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        _positive(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            vocab=self.vocab,
            seq_len=self.seq_len,
        )
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        kv = self.kv_heads_or_heads
        if kv < 1 or self.heads % kv:
            raise ValueError(f"kv_heads must divide heads ({self.heads}), got {self.kv_heads!r}")
        if self.ffn_hidden is not None:
            _positive(ffn_hidden=self.ffn_hidden)
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
        if self.experts < 0 or (self.experts and not 1 <= self.top_k <= self.experts):
            raise ValueError(
                f"need experts >= 0 and 1 <= top_k <= experts, got {self.experts!r}, {self.top_k!r}"
            )

    @property
    def kv_heads_or_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def kv_ratio(self) -> float:
        """kv_heads / heads: the share of a K or V projection's width against Q's."""
        return self.kv_heads_or_heads / self.heads

    @property
    def ffn(self) -> int:
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def attention_params(self) -> float:
        """Q and output projections h x h, K and V h x (h kv/heads), per layer."""
        h = self.hidden
        return 2 * h * h + 2 * h * h * self.kv_ratio

    @property
    def mlp_params(self) -> float:
        """One MLP's matrices (one expert's in a mixture), per layer."""
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def expert_params(self) -> float:
        """All experts' matrices over all layers (0 for a dense model)."""
        return self.layers * self.experts * self.mlp_params if self.experts else 0.0

    @property
    def layer_params(self) -> float:
        """Matrices of one layer (all of its experts): what ZeRO-3 gathers for the layer in
        use; 12 h^2 for a GPT-style layer."""
        copies = self.experts or 1
        router = self.hidden * self.experts
        return self.attention_params + copies * self.mlp_params + router

    @property
    def num_params(self) -> float:
        return param_count(self)

    @property
    def active_params(self) -> float:
        """Parameters a token passes through: in a mixture, top_k of each layer's experts
        instead of all of them (the router counted); a dense or stated count: all."""
        if not self.experts or self.params is not None:
            return self.num_params
        return self.num_params - self.expert_params * (1 - self.top_k / self.experts)


def param_count(shape: TransformerShape) -> float:
    """Parameters of ``shape`` (its stated ``params`` if it has one).

    Per layer the matrices of :attr:`TransformerShape.layer_params`, and with ``biases`` the
    Q, K, V and output biases (2h + 2h kv/heads), the MLP's (f per gate/up matrix, h for the
    down one) and two LayerNorms (4h); without, two RMSNorm gains (2h) and a final one (h).
    Embeddings V h, twice if untied; learned positions s h.
    """
    if shape.params is not None:
        return float(shape.params)
    h, f, n = shape.hidden, shape.ffn, shape.layers
    copies = shape.experts or 1
    if shape.biases:
        attention_biases = 2 * h + 2 * h * shape.kv_ratio
        mlp_biases = copies * ((shape.mlp_matrices - 1) * f + h)
        per_layer_extra = attention_biases + mlp_biases + 4 * h
        final_norm = 0  # Narayanan et al.'s equation (2) leaves it out
    else:
        per_layer_extra = 2 * h
        final_norm = h
    embeddings = shape.vocab * h * (1 if shape.tied_embeddings else 2)
    positions = shape.seq_len * h if shape.learned_positions else 0
    return n * (shape.layer_params + per_layer_extra) + embeddings + positions + final_norm


def from_gpt_config(config) -> TransformerShape:
    """The shape of 07's ``distopt.project.gpt.GPT`` built from ``config`` (a ``GPTConfig``):
    GELU MLP of width ``mlp_ratio`` x d_model, biases and LayerNorms, learned positions and an
    output layer of its own (untied). Its count leaves out the final LayerNorm (2 d_model), as
    Narayanan et al.'s equation (2) does."""
    return TransformerShape(
        config.n_layer,
        config.d_model,
        config.n_head,
        config.vocab_size,
        config.seq_len,
        ffn_hidden=config.mlp_ratio * config.d_model,
        tied_embeddings=False,
    )


def _llama3(layers: int, hidden: int, heads: int, ffn: int) -> TransformerShape:
    return TransformerShape(
        layers,
        hidden,
        heads,
        vocab=128_256,
        seq_len=8192,
        kv_heads=8,
        ffn_hidden=ffn,
        mlp="swiglu",
        tied_embeddings=False,
        biases=False,
        learned_positions=False,
    )


# key: (label, shape). Published shapes: Llama 3 (Llama Team 2024, Table 3), GPT-3 (Brown et
# al. 2020, Table 2.1, GPT-2's vocabulary), Llama 2 7B/70B (Touvron et al. 2023), Mixtral 8x7B
# (Jiang et al. 2024, Table 1: Mistral 7B's layers with 8 experts, top-2; 32,768 tokens of
# context).
PRESETS: dict[str, tuple[str, TransformerShape]] = {
    "llama3-8b": ("Llama-3 8B", _llama3(32, 4096, 32, 14_336)),
    "llama3-70b": ("Llama-3 70B", _llama3(80, 8192, 64, 28_672)),
    "llama3-405b": ("Llama-3 405B", _llama3(126, 16_384, 128, 53_248)),
    "gpt3-175b": ("GPT-3 175B", TransformerShape(96, 12_288, 96, 50_257, 2048)),
    "llama2-7b": (
        "Llama-2 7B",
        TransformerShape(
            32,
            4096,
            32,
            32_000,
            4096,
            ffn_hidden=11_008,
            mlp="swiglu",
            tied_embeddings=False,
            biases=False,
            learned_positions=False,
        ),
    ),
    "mixtral-8x7b": (
        "Mixtral 8x7B",
        TransformerShape(
            32,
            4096,
            32,
            32_000,
            32_768,
            kv_heads=8,
            ffn_hidden=14_336,
            mlp="swiglu",
            tied_embeddings=False,
            biases=False,
            learned_positions=False,
            experts=8,
            top_k=2,
        ),
    ),
}


@dataclass(frozen=True)
class Layout:
    """One way to run a model: the first six fields in the order the planner always took.

    t c p d = GPUs (tensor, context, pipeline, data); the experts are sharded over ``expert``
    of the d data-parallel replicas (e | d). ``zero_stage`` shards over the d c GPUs that hold
    the same weights. ``recompute``: "none", "selective" (Megatron's: the attention core's
    s^2 tensors are dropped and recomputed in the backward pass) or "full" (each layer keeps
    only its input); True and False are read as "full" and "none". ``flash_attention``: the
    attention scores are never stored (FlashAttention recomputes them blockwise in its
    backward), so "selective" has nothing left to drop. ``sequence_parallel`` acts only with
    t > 1 (Korthikanti et al. 2022: the LayerNorm and dropout activations split over t too).
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    zero_stage: int = 0
    micro_batch: int = 1  # sequences per micro-batch
    recompute: str = "none"
    context: int = 1
    expert: int = 1
    flash_attention: bool = True
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {self.recompute!r}")
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {self.zero_stage!r}")
        _positive(
            tensor=self.tensor,
            pipeline=self.pipeline,
            data=self.data,
            micro_batch=self.micro_batch,
            context=self.context,
            expert=self.expert,
        )

    @property
    def gpus(self) -> int:
        return self.tensor * self.context * self.pipeline * self.data

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per step: global_batch / (d x micro_batch)."""
        return global_batch // (self.data * self.micro_batch)
