"""Tests of distopt.costs.transformer: Narayanan et al. 2021 parameter and FLOP counts."""

import math

import pytest

from distopt.costs.transformer import param_count, training_flops


def test_param_count_gpt3_175b():
    # GPT-3: 96 layers, hidden 12288, vocabulary 51200, 2048 tokens: about 175 billion.
    assert param_count(96, 12288, 51200, 2048) == pytest.approx(174.6e9, rel=1e-3)


def test_param_count_by_hand():
    layers, hidden, vocab, seq_len = 2, 8, 100, 16
    by_hand = layers * (12 * hidden**2 + 13 * hidden) + (vocab + seq_len) * hidden
    assert math.isclose(param_count(layers, hidden, vocab, seq_len), by_hand)


def test_training_flops_matches_equation_3_and_6nd():
    b, s, n, h, v = 8, 2048, 24, 2048, 51200
    eq3 = 96 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h))
    assert math.isclose(training_flops(b, s, n, h, v, recompute=True), eq3)
    # Without recomputation, close to 6 x tokens x parameters for a wide model.
    six_nd = 6 * b * s * param_count(n, 8 * h, v, s)
    ratio = training_flops(b, s, n, 8 * h, v) / six_nd
    assert 1.0 < ratio < 1.1


def test_recompute_adds_one_forward():
    without = training_flops(1, 1024, 4, 512, 1000)
    with_ = training_flops(1, 1024, 4, 512, 1000, recompute=True)
    logit = 6 * 1024 * 512 * 1000
    assert math.isclose((with_ - logit) / (without - logit), 4 / 3)


def test_bad_input():
    with pytest.raises(ValueError, match="layers"):
        param_count(0, 8, 10, 10)
    with pytest.raises(ValueError, match="batch"):
        training_flops(0, 8, 1, 8, 10)
