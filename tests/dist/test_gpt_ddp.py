"""distopt.dist.gpt_ddp: data parallelism with the course's loop matches one process."""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from distopt import launch
from distopt.project.gpt import GPTConfig
from distopt.project.loop import TrainConfig, lr_range_test, train
from distopt.dist.gpt_ddp import ddp_no_overlap


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: the fastest for these tiny models, and a fixed float summation order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = TrainConfig(
    model=GPTConfig(vocab_size=8, seq_len=16, n_layer=1, n_head=2, d_model=16),
    order=1,
    branching=2,
    train_tokens=4096,
    batch_size=8,
    steps=30,
    warmup_steps=3,
    peak_lr=1e-2,
    eval_every=10,
    eval_batches=1,
    dtype="float32",
)
HISTORY_KEYS = {"step", "loss", "grad_norm", "lr", "step_time", "val_step", "val_loss"}


def test_no_overlap_data_parallel_matches_one_process():
    config = replace(TINY, steps=4, eval_every=4)
    ranks = launch(ddp_no_overlap, 2, config, timeout=60)
    single = train(config)[1]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert len(ranks[0]["comm_time"]) == len(ranks[0]["compute_time"]) == 4
