"""distopt.ranks.gpt_ddp_ranks: data parallelism with the course's loop matches one process."""

from dataclasses import replace

import pytest

from distopt import launch
from distopt.project.loop import train
from distopt.ranks.gpt_ddp_ranks import ddp_no_overlap
from tests.project.tiny import TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_no_overlap_data_parallel_matches_one_process():
    config = replace(TINY, steps=4, eval_every=4)
    ranks = launch(ddp_no_overlap, 2, config, timeout=60)
    single = train(config)[1]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert len(ranks[0]["comm_time"]) == len(ranks[0]["compute_time"]) == 4
