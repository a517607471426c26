"""distopt.problems.corpus: the Markov language, its exact entropy and the batches."""

import math

import numpy as np
import pytest

from distopt.problems.corpus import (
    TokenData,
    loss_floor,
    markov_language,
    previous_token_floor,
    sample_chains,
)


def test_transition_rows_are_sparse_distributions():
    lang = markov_language(8, order=2, branching=3, seed=1)
    assert lang.transition.shape == (64, 8)
    np.testing.assert_allclose(lang.transition.sum(axis=1), 1.0)
    assert ((lang.transition > 0).sum(axis=1) == 3).all()
    assert math.isclose(lang.stationary.sum(), 1.0)


def test_entropy_rate_matches_the_empirical_loss_of_the_true_model():
    lang = markov_language(8, order=2, branching=3, seed=1)
    x = sample_chains(lang, 200, 500, seed=2)
    probs = lang.transition[x[:, :-2] * 8 + x[:, 1:-1], x[:, 2:]]
    assert (probs > 0).all()
    assert abs(-np.log(probs).mean() - lang.entropy_rate) < 0.01


def test_uniform_successors_give_log_branching():
    lang = markov_language(6, order=1, branching=6, concentration=1e6, seed=0)
    assert math.isclose(lang.entropy_rate, math.log(6), rel_tol=1e-4)


def test_loss_floor_counts_the_short_contexts():
    lang = markov_language(8, order=2, branching=3, seed=1)
    assert loss_floor(lang, 1000) == pytest.approx(lang.entropy_rate, abs=0.01)
    assert loss_floor(lang, 4) > lang.entropy_rate
    # the first position sees one token: its floor is H(X1 | X0) >= entropy rate
    assert loss_floor(lang, 1) >= lang.entropy_rate


def test_the_previous_token_alone_leaves_a_gap_above_the_entropy_rate():
    lang = markov_language(8, order=2, branching=3, seed=1)
    bigram = previous_token_floor(lang)
    # the first position of a window sees exactly one token: the same conditional entropy
    assert bigram == pytest.approx(loss_floor(lang, 1), abs=1e-12)
    assert bigram > lang.entropy_rate + 0.3
    # the best bigram table estimated from a long text scores about that
    x = sample_chains(lang, 200, 500, seed=3)
    counts = np.zeros((8, 8))
    np.add.at(counts, (x[:, :-1].ravel(), x[:, 1:].ravel()), 1)
    conditional = counts / counts.sum(axis=1, keepdims=True)
    empirical = -np.log(conditional[x[:, :-1], x[:, 1:]]).mean()
    assert abs(empirical - bigram) < 0.02
    order_one = markov_language(6, order=1, branching=3, seed=0)
    assert previous_token_floor(order_one) == order_one.entropy_rate


def test_batches_are_a_function_of_the_step():
    lang = markov_language(8, order=2, branching=3, seed=1)
    data = TokenData(lang, 16, train_tokens=4096, val_tokens=1024, chain_length=256, seed=3)
    assert data.batch(5, 4).shape == (4, 17)
    assert (data.batch(5, 4) == data.batch(5, 4)).all()
    assert not (data.batch(5, 4) == data.batch(6, 4)).all()
    assert (data.val_batches(2, 4)[1] == data.val_batches(2, 4)[1]).all()


def test_bad_arguments():
    with pytest.raises(ValueError):
        markov_language(8, branching=9)
    with pytest.raises(ValueError):
        markov_language(8, concentration=0)
    with pytest.raises(ValueError):
        TokenData(markov_language(8, seed=0), 64, chain_length=32)
