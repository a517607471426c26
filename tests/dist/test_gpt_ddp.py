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
from tests.project.tiny import HISTORY_KEYS, TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")




def test_no_overlap_data_parallel_matches_one_process():
    config = replace(TINY, steps=4, eval_every=4)
    ranks = launch(ddp_no_overlap, 2, config, timeout=60)
    single = train(config)[1]
    assert ranks[0]["loss"] == ranks[1]["loss"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert len(ranks[0]["comm_time"]) == len(ranks[0]["compute_time"]) == 4
