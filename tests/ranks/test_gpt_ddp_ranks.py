"""distopt.ranks.gpt_ddp_ranks: data parallelism with the course's loop matches one process."""

from dataclasses import replace

import pytest

from distopt import launch
from distopt.engine import record
from distopt.project.loop import make_model, train
from distopt.ranks.gpt_ddp_ranks import data_parallel, ddp_no_overlap
from tests.project.tiny import TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_no_overlap_data_parallel_matches_one_process():
    config = replace(TINY, steps=4, eval_every=4)
    ranks = launch(ddp_no_overlap, 2, config, timeout=60)
    single = train(config)[1]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert len(ranks[0]["comm_time"]) == len(ranks[0]["compute_time"]) == 4


def _ddp_then_fsdp(rank, world_size, config):
    """DDP with small buckets (its all-reduces recorded), then FSDP2, on the same ranks."""
    with record.communication() as log:
        ddp = data_parallel(rank, world_size, config, "ddp", bucket_mb=4096 / 2**20)
    fsdp = data_parallel(rank, world_size, config, "fsdp")
    return ddp, fsdp, log


def test_ddp_and_fsdp2_accumulating_match_one_process_and_communicate_once_per_step():
    # 2 ranks x 2 micro-batches of 2 sequences = the 8 sequences one process trains on
    steps = 3
    config = replace(TINY, steps=steps, eval_every=steps, micro_batches=2)
    (ddp, fsdp, log), _ = launch(_ddp_then_fsdp, 2, config, timeout=90)
    single = train(replace(config, micro_batches=1))[1]
    for history in (ddp, fsdp):
        assert history["loss"] == pytest.approx(single["loss"], rel=1e-5)
        assert history["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    assert len(ddp["comm_time"]) == steps  # exposed communication, timed
    # per step: one all-reduce per bucket after the last micro-batch only, and the loss's
    gradients = log.count("all_reduce") - steps
    buckets = gradients // steps
    assert gradients == steps * buckets and buckets >= 3, log.summary()
    grad_bytes = 4 * sum(p.numel() for p in make_model(TINY).parameters())
    assert log.payload_bytes("all_reduce") == steps * (grad_bytes + 4), log.summary()
    # the buckets start while the backward pass runs: all but the last, at least
    assert len(log.during_backward("all_reduce")) >= steps * (buckets - 1)
