"""A seeded synthetic language whose entropy is known exactly: a sparse random Markov chain.

Each token depends on the ``order`` tokens before it: from every context (a tuple of
``order`` tokens) only ``branching`` of the ``vocab_size`` tokens can follow, with
probabilities drawn from a Dirichlet distribution. The chain is stationary (the first
``order`` tokens of a sequence are drawn from the stationary distribution), so the best
possible next-token loss is known in closed form (Cover & Thomas 2006, Theorem 4.2.4):
the entropy rate ``H = sum_c pi(c) H(P[c, :])`` nats per token, with ``pi`` the stationary
distribution over contexts. A model that has learnt the language reaches ``H``; one that
has learnt nothing sits at ``ln(vocab_size)``; a training loss *below* ``H`` on held-out-free
data means memorisation.

The token stream is cut into a training and a validation split from independent chains;
``TokenData.batch(step)`` is a pure function of ``(seed, step)``, so a run that resumes from
a checkpoint at step ``k`` sees exactly the batches it would have seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "MarkovLanguage",
    "TokenData",
    "loss_floor",
    "markov_language",
    "previous_token_floor",
    "sample_chains",
]


@dataclass(frozen=True, eq=False)
class MarkovLanguage:
    """A Markov chain of order ``order`` over ``vocab_size`` tokens."""

    vocab_size: int
    order: int
    transition: np.ndarray  # (vocab_size ** order, vocab_size): P(next | context), rows sum to 1
    stationary: np.ndarray  # (vocab_size ** order,): stationary distribution over contexts

    @property
    def entropy_rate(self) -> float:
        """Nats per token: the loss floor once the context is ``order`` tokens long."""
        return float(self.stationary @ _row_entropy(self.transition))


def _row_entropy(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(axis=-1)


def markov_language(
    vocab_size: int = 64,
    *,
    order: int = 2,
    branching: int = 4,
    concentration: float = 1.0,
    seed: int = 0,
) -> MarkovLanguage:
    """Draw a random sparse chain: ``branching`` successors per context, Dirichlet weights.

    ``concentration`` is the Dirichlet parameter (small: a few likely successors, lower
    entropy; large: nearly uniform over the ``branching`` successors, entropy near
    ``ln(branching)``). The chain must be irreducible for the stationary distribution to be
    unique; with ``branching >= 2`` random successors it is, with overwhelming probability.
    (Were it not, the chain started from the distribution found here is still stationary,
    and the entropy rate below still its loss floor.)
    """
    if vocab_size < 2 or order < 1 or not 1 <= branching <= vocab_size:
        raise ValueError(
            f"need vocab_size >= 2, order >= 1, 1 <= branching <= vocab_size; got "
            f"{vocab_size}, {order}, {branching}"
        )
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration!r}")
    num_contexts = vocab_size**order
    if num_contexts > 1 << 16:
        raise ValueError(f"vocab_size ** order = {num_contexts} contexts is too many (<= 65536)")
    rng = np.random.default_rng(seed)
    transition = np.zeros((num_contexts, vocab_size))
    for context in range(num_contexts):
        successors = rng.choice(vocab_size, size=branching, replace=False)
        transition[context, successors] = rng.dirichlet(np.full(branching, concentration))
    stationary = _stationary(transition, vocab_size, order)
    return MarkovLanguage(vocab_size, order, transition, stationary)


def _stationary(transition: np.ndarray, vocab_size: int, order: int) -> np.ndarray:
    """Stationary distribution over contexts, by power iteration on the sparse chain.

    A context (c_1..c_k) followed by token x becomes (c_2..c_k, x).
    """
    num_contexts = transition.shape[0]
    rows, nxt = np.nonzero(transition)
    cols = (rows * vocab_size) % num_contexts + nxt
    weights = transition[rows, nxt]

    def step(pi: np.ndarray) -> np.ndarray:
        return np.bincount(cols, weights=pi[rows] * weights, minlength=num_contexts)

    # Power iteration on the lazy chain (I + P) / 2: converges even for periodic chains.
    pi = np.full(num_contexts, 1 / num_contexts)
    for _ in range(20_000):
        new = 0.5 * (pi + step(pi))
        if np.abs(new - pi).sum() < 1e-13:
            break
        pi = new
    else:
        raise ValueError("the chain did not mix; draw another seed or raise branching")
    return new / new.sum()


def sample_chains(
    language: MarkovLanguage, num_chains: int, length: int, *, seed: int = 0
) -> np.ndarray:
    """``num_chains`` independent stationary chains of ``length`` tokens: int64 (chains, length).

    Vectorised over the chains: one numpy step per token position.
    """
    if num_chains < 1 or length < language.order:
        raise ValueError(f"need num_chains >= 1 and length >= order; got {num_chains}, {length}")
    v, k = language.vocab_size, language.order
    rng = np.random.default_rng(seed)
    context = rng.choice(language.stationary.size, size=num_chains, p=language.stationary)
    out = np.empty((num_chains, length), dtype=np.int64)
    for i in range(k):  # the first `order` tokens are the context's digits, oldest first
        out[:, i] = (context // v ** (k - 1 - i)) % v
    cumulative = np.cumsum(language.transition, axis=1)
    cumulative[:, -1] = 1.0
    uniforms = rng.random((length, num_chains))
    num_contexts = v**k
    for t in range(k, length):
        nxt = (uniforms[t][:, None] < cumulative[context]).argmax(axis=1)
        out[:, t] = nxt
        context = (context * v) % num_contexts + nxt
    return out


def loss_floor(language: MarkovLanguage, seq_len: int) -> float:
    """Lowest expected loss (nats/token) of a model predicting tokens 1..seq_len of a window
    from the tokens before them, averaged over the ``seq_len`` positions.

    Position ``t`` (predicting token ``t`` from tokens ``0..t-1``) is bounded by the
    conditional entropy ``H(X_t | X_<t)``: for ``t >= order`` that is the entropy rate; before,
    the context is shorter and the bound is ``H(X_0..X_t) - H(X_0..X_t-1)``, computed from
    marginals of the stationary distribution over contexts.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    v, k = language.vocab_size, language.order
    joint = language.stationary.reshape((v,) * k)
    # H of the first j tokens for j = 1..k (marginal over the later context digits)
    block_entropy = [0.0]
    for j in range(1, k + 1):
        marginal = joint.sum(axis=tuple(range(j, k))) if j < k else joint
        block_entropy.append(float(_row_entropy(marginal.ravel()[None, :])[0]))
    per_position = []
    for t in range(1, seq_len + 1):
        if t < k:
            per_position.append(block_entropy[t + 1] - block_entropy[t])
        else:
            per_position.append(language.entropy_rate)
    return float(np.mean(per_position))


def previous_token_floor(language: MarkovLanguage) -> float:
    """Lowest loss (nats/token) of a model that sees only the previous token: H(X_t | X_t-1).

    What a bigram table reaches at best. For an order-2 chain it lies above the entropy rate:
    the token two back, which only attention can fetch, is what closes the gap.
    """
    v, k = language.vocab_size, language.order
    if k < 2:
        return language.entropy_rate
    # P(last k context tokens, next) -> marginal over all but the last context token
    joint = (language.stationary[:, None] * language.transition).reshape((v,) * k + (v,))
    pair = joint.sum(axis=tuple(range(k - 1)))  # (previous token, next token)
    previous = pair.sum(axis=1)
    rows = _row_entropy(pair / np.where(previous > 0, previous, 1.0)[:, None])
    return float(previous @ rows)


@dataclass
class TokenData:
    """Training and validation windows of a Markov language, drawn by step number.

    ``train_tokens`` tokens of training text (small: the model can memorise it) and
    ``val_tokens`` of validation text, from independent chains of ``chain_length`` tokens.
    """

    language: MarkovLanguage
    seq_len: int  # tokens a model sees; a window holds seq_len + 1 (inputs and targets)
    train_tokens: int = 1 << 20  # size of the training text, tokens
    val_tokens: int = 1 << 15  # size of the validation text, tokens
    chain_length: int = 1024  # tokens per independent chain
    seed: int = 0
    train: np.ndarray = field(init=False, repr=False)  # (chains, chain_length) int64
    val: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.chain_length < self.seq_len + 1:
            raise ValueError(f"chain_length {self.chain_length} < seq_len + 1 = {self.seq_len + 1}")
        chains = [
            max(1, math.ceil(n / self.chain_length)) for n in (self.train_tokens, self.val_tokens)
        ]
        both = sample_chains(self.language, sum(chains), self.chain_length, seed=self.seed)
        self.train, self.val = both[: chains[0]], both[chains[0] :]

    def _windows(self, text: np.ndarray, rng: np.random.Generator, batch_size: int) -> torch.Tensor:
        rows = rng.integers(0, text.shape[0], batch_size)
        starts = rng.integers(0, text.shape[1] - self.seq_len, batch_size)
        idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        return torch.from_numpy(text[rows[:, None], idx])

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        """Training windows (batch_size, seq_len + 1) for ``step``: a function of (seed, step)."""
        return self._windows(self.train, np.random.default_rng([self.seed, 1, step]), batch_size)

    def val_batches(self, num_batches: int, batch_size: int) -> list[torch.Tensor]:
        """A fixed set of validation windows (the same at every evaluation)."""
        rng = np.random.default_rng([self.seed, 2])
        return [self._windows(self.val, rng, batch_size) for _ in range(num_batches)]
