"""distopt.project.gpt: shapes, causality, parameter groups, μP and the FLOP count."""

import math

import pytest
import torch

from distopt.costs import transformer
from distopt.project.gpt import GPT, GPTConfig, flops_per_token, max_attention_logit, param_groups

SMALL = GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)


def test_logits_shape_and_loss_at_init_near_uniform():
    torch.manual_seed(0)
    model = GPT(SMALL)
    tokens = torch.randint(0, 16, (3, 9))
    assert model(tokens[:, :-1]).shape == (3, 8, 16)
    assert abs(model.loss(tokens).item() - math.log(16)) < 0.5


def test_causal_a_later_token_does_not_change_earlier_logits():
    torch.manual_seed(0)
    model = GPT(SMALL)
    tokens = torch.randint(0, 16, (1, 8))
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 16
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_param_groups_split_and_mup_rates():
    model = GPT(GPTConfig(vocab_size=16, seq_len=8, d_model=64, n_head=2, mup_base_width=16))
    groups = param_groups(model, lr=0.01, weight_decay=0.1)
    hidden = [g for g in groups if g["lr_scale"] == 0.25]  # width_mult = 64 / 16
    assert len(hidden) == 1 and math.isclose(hidden[0]["lr"], 0.0025)
    assert hidden[0]["weight_decay"] == 0.1 and all(p.ndim == 2 for p in hidden[0]["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    vectors = [g for g in groups if g["weight_decay"] == 0]
    assert all(p.ndim == 1 for p in vectors[0]["params"]) and vectors[0]["lr"] == 0.01


def test_mup_readout_starts_at_zero_and_logits_shrink_with_width():
    mup = GPT(GPTConfig(vocab_size=16, seq_len=8, d_model=32, n_head=2, mup_base_width=16))
    assert torch.count_nonzero(mup.head.weight) == 0
    assert mup.config.width_mult == 2.0 and SMALL.width_mult == 1.0


def test_flops_per_token_matches_narayanan():
    config = GPTConfig(vocab_size=50, seq_len=32, n_layer=3, n_head=4, d_model=48)
    per_step = transformer.training_flops(5, 32, 3, 48, 50)
    assert math.isclose(flops_per_token(config), per_step / (5 * 32), rel_tol=1e-12)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="divide"):
        GPTConfig(d_model=30, n_head=4)
    with pytest.raises(ValueError):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="exceeds"):
        GPT(SMALL)(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="norm_placement"):
        GPTConfig(norm_placement="middle")


def test_post_norm_blocks_normalise_after_each_residual_addition():
    torch.manual_seed(0)
    post = GPT(GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16,
                         norm_placement="post"))  # fmt: skip
    torch.manual_seed(0)
    pre = GPT(SMALL)
    assert [n for n, _ in post.named_parameters()] == [n for n, _ in pre.named_parameters()]
    x = torch.randn(2, 8, 16)
    block = post.blocks[0]
    expected = block.ln1(x + block.attn(x))
    expected = block.ln2(expected + block.mlp(expected))
    torch.testing.assert_close(block(x), expected)
    # a post-norm block's output is normalised: each token has mean 0 and variance 1
    out = block(x)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    assert not torch.allclose(pre.blocks[0](x), out)


def _attention_logits_by_hand(model: GPT, tokens: torch.Tensor) -> float:
    """One block: the logits scale * q . k of its attention, computed from the weights."""
    x = model.tok_emb(tokens) + model.pos_emb(torch.arange(tokens.shape[1]))
    attn = model.blocks[0].attn
    q, k, _ = attn.qkv(model.blocks[0].ln1(x)).split(x.shape[-1], dim=2)
    d_head = x.shape[-1] // attn.n_head
    q, k = (t.view(*t.shape[:2], attn.n_head, d_head).transpose(1, 2) for t in (q, k))
    if model.config.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    logits = (q @ k.transpose(-2, -1)) * attn.scale
    return float(logits.abs().masked_select(torch.ones(8, 8, dtype=torch.bool).tril()).max())


@pytest.mark.parametrize("qk_norm", [False, True])
def test_max_attention_logit_is_the_largest_causal_logit(qk_norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SMALL.__dict__, "n_layer": 1, "qk_norm": qk_norm}))
    tokens = torch.randint(0, 16, (2, 8))
    with torch.no_grad():
        assert max_attention_logit(model, tokens) == pytest.approx(
            _attention_logits_by_hand(model, tokens), rel=1e-6
        )


def test_qk_layernorm_caps_attention_logits_however_large_the_weights():
    """Normalised q and k have norm sqrt(d_head) (unit gains), so |scale q.k| <= sqrt(d_head)."""
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(1))
    largest = {}
    for qk_norm in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{**SMALL.__dict__, "qk_norm": qk_norm}))
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv.weight.mul_(30)  # what a too-large rate does over many steps
        largest[qk_norm] = max_attention_logit(model, tokens)
    d_head = SMALL.d_model // SMALL.n_head
    assert largest[True] <= math.sqrt(d_head) * (1 + 1e-4)
    assert largest[False] > 20 * largest[True]
