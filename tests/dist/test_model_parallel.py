"""Tests of distopt.dist.model_parallel: real DTensor and pipelining runs vs one process.

One launch of 2 ranks runs both ``tensor_parallel.dtensor_mlp_check`` and
``pipeline.pipelining_grad_check`` (the notebook also runs them on 4 ranks).
"""

from distopt import launch
from distopt.dist.model_parallel import engine_checks


def test_engine_checks_match_single_process():
    for result in launch(engine_checks, 2, timeout=90):
        assert result["tensor"]["max_abs_output_diff"] < 1e-12
        assert result["tensor"]["max_abs_grad_diff"] < 1e-12
        assert result["tensor"]["max_abs_input_grad_diff"] < 1e-12
        # Megatron's g all-reduces in the forward, f in the backward: one each, no more
        assert result["tensor"]["forward_all_reduces"] == 1
        assert result["tensor"]["backward_all_reduces"] == 1
        # Linear(16, 64) split by output features: each of 2 ranks holds 32 rows.
        assert result["tensor"]["local_weight_shape"] == (32, 16)
        assert all(diff < 1e-12 for diff in result["pipeline"]["max_abs_grad_diff"].values())
