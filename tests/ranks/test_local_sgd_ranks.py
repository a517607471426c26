"""Tests of distopt.ranks.local_sgd_ranks: real multi-process local SGD and DiLoCo runs
against the single-process baseline, and their all-reduced bytes."""

import numpy as np
import pytest

from distopt import launch
from distopt.ranks.local_sgd_ranks import (
    LocalSGDConfig,
    inner_optimizer_name,
    train_local_sgd_single_process,
    train_local_sgd_variants,
)

# float32: the all-reduce sums in another order than the single process's mean.
TOLERANCE = 1e-6
CONFIGS = [
    LocalSGDConfig(variant="ddp", num_steps=8, local_steps=1),
    LocalSGDConfig(variant="local", num_steps=8, local_steps=4),
    LocalSGDConfig(variant="diloco", num_steps=8, local_steps=4, lr=0.01),
    LocalSGDConfig(variant="ddp", num_steps=8, local_steps=1, inner="adam", lr=0.01),
]


@pytest.fixture(scope="module")
def per_rank():
    """One launch on 2 ranks for all variants (spawning is slow)."""
    return launch(train_local_sgd_variants, 2, CONFIGS)


def test_multi_process_runs_match_the_single_process_baseline(per_rank):
    for index, config in enumerate(CONFIGS):
        reference = train_local_sgd_single_process(config, 2)
        for report in (per_rank[0][index], per_rank[1][index]):
            for got, expected in zip(report["weights"], reference["weights"], strict=True):
                assert np.abs(got - expected).max() < TOLERANCE, config.variant
            assert abs(report["loss"] - reference["loss"]) < 1e-5


def test_bytes_all_reduced_are_ddp_divided_by_h(per_rank):
    param_bytes = 4 * sum(p.size for p in per_rank[0][0]["weights"])
    ddp, local, diloco, ddp_adam = per_rank[0]
    assert ddp["bytes_all_reduced"] == ddp_adam["bytes_all_reduced"] == 8 * param_bytes
    assert local["bytes_all_reduced"] == diloco["bytes_all_reduced"] == 2 * param_bytes
    assert local["num_all_reduces"] == 2


def test_inner_optimizer_is_the_variants_own_unless_named():
    assert inner_optimizer_name(LocalSGDConfig(variant="diloco")) == "adam"
    assert inner_optimizer_name(LocalSGDConfig(variant="ddp")) == "sgd"
    assert inner_optimizer_name(LocalSGDConfig(variant="ddp", inner="adam")) == "adam"
    # The Adam control is not SGD: its weights differ from DDP with SGD after one step.
    sgd = train_local_sgd_single_process(
        LocalSGDConfig(variant="ddp", num_steps=1, local_steps=1), 2
    )
    adam = train_local_sgd_single_process(
        LocalSGDConfig(variant="ddp", num_steps=1, local_steps=1, inner="adam", lr=0.1), 2
    )
    assert (
        max(np.abs(a - b).max() for a, b in zip(sgd["weights"], adam["weights"], strict=True))
        > 1e-3
    )


def test_bad_config():
    with pytest.raises(ValueError, match="inner"):
        train_local_sgd_single_process(LocalSGDConfig(inner="lamb"), 2)
    with pytest.raises(ValueError, match="multiple"):
        train_local_sgd_single_process(LocalSGDConfig(num_steps=10, local_steps=4), 2)
