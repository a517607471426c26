"""Tests of distopt.ranks.model_parallel_ranks: real DTensor and pipelining runs vs one process.

One launch of 2 ranks runs both ``tensor_parallel.dtensor_mlp_check`` and
``pipeline.pipelining_grad_check`` (the notebook also runs them on 4 ranks). Then the
hand-written Megatron MLP and GPipe stage (the reference answers, kept with the grader), and
the measured timelines as simulator tasks.
"""

import pytest

from autograder.references.model_parallel import gpipe_stage, megatron_mlp_rank
from distopt import launch
from distopt.problems.megatron_mlp import MegatronMLP
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_checks as checks
from distopt.ranks.model_parallel_ranks import engine_checks, measured_tasks


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


# The reference answers of section 03's rank-code exercises, run as the notebook's tests run
# them (model_parallel_checks); guard=False, since the guard forbids exactly these functions.


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_megatron_mlp_rank_matches_one_process_with_one_all_reduce_each_way(world_size):
    problem = MegatronMLP(hidden=6, tokens=3, world_size=world_size, seed=world_size)
    results = checks.run_megatron_mlp(megatron_mlp_rank, problem, guard=False)
    checks.assert_mlp_matches(results, problem)
    checks.assert_fg_payloads(results, problem)
    for _, log in results:
        forward, backward = checks.by_pass(log, "all_reduce")
        assert (len(forward), len(backward)) == (1, 1)
        sizes = {call.payload_bytes for call in forward + backward}
        assert sizes == {problem.activation_bytes}


@pytest.mark.parametrize("stages", [1, 3])
def test_gpipe_stage_matches_the_unsplit_model_with_m_messages_each_way(stages):
    problem = PipelineStack(stages=stages, micro_batches=3, micro_batch=2, width=4, seed=stages)
    results = checks.run_pipeline(gpipe_stage, problem, guard=False)
    checks.assert_stage_grads_match(results, problem)
    checks.assert_gpipe_messages(results, problem)
    checks.assert_gpipe_timeline(results, problem)
    for rank, (_, log) in enumerate(results):
        neighbours = [peer for peer in (rank - 1, rank + 1) if 0 <= peer < stages]
        expected = {(way, peer): [problem.message_bytes] * 3 for way in ("send", "recv")
                    for peer in neighbours}  # fmt: skip
        assert checks.point_to_point(log) == expected


def test_measured_tasks_count_from_the_earliest_start_in_the_given_unit():
    timelines = [[("F", 0, 10.0, 10.5), ("B", 0, 12.0, 13.0)], [("F", 0, 10.6, 11.0)]]
    tasks = measured_tasks(timelines, 0.5)
    assert [(t.device, t.kind, t.micro_batch, t.start, t.end) for t in tasks] == [
        (0, "F", 0, 0.0, 1.0),
        (0, "B", 0, 4.0, 6.0),
        (1, "F", 0, pytest.approx(1.2), pytest.approx(2.0)),
    ]
    assert measured_tasks([[], []], 1.0) == []
