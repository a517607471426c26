"""Tests of distopt.problems.pipeline_stack: stages chain into the model; its gradients."""

import pytest
import torch

from distopt.problems.pipeline_stack import PipelineStack

TOL = 1e-12


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_stages_chain_into_the_full_model_and_hold_only_their_data(stages):
    problem = PipelineStack(stages=stages, micro_batches=3, micro_batch=2, width=5, seed=4)
    parts = [problem.stage(rank) for rank in range(stages)]
    x, _ = problem.batch()
    out = x
    for part in parts:
        out = part.model(out)
    assert (out - problem.full_model()(x)).abs().max() < TOL
    assert parts[0].inputs is not None and len(parts[0].inputs) == 3
    assert parts[-1].targets is not None and len(parts[-1].targets) == 3
    assert all(p.inputs is None for p in parts[1:]) and all(p.targets is None for p in parts[:-1])
    assert problem.message_bytes == 2 * 5 * 8 and parts[0].batch_size == 6


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_micro_batches_through_the_stages_give_the_reference_gradients(stages):
    # GPipe's arithmetic in one process: each micro-batch through the stages in turn, its
    # share loss_sum / batch_size backpropagated, gradients adding up over the micro-batches.
    problem = PipelineStack(stages=stages, micro_batches=4, micro_batch=3, width=6, seed=5)
    parts = [problem.stage(rank) for rank in range(stages)]
    for k in range(problem.micro_batches):
        out = parts[0].inputs[k]
        for part in parts:
            out = part.model(out)
        (parts[-1].loss_sum(out, parts[-1].targets[k]) / problem.batch_size).backward()
    for part, expected in zip(parts, problem.reference_grads(), strict=True):
        for p, g in zip(part.model.parameters(), expected, strict=True):
            assert (p.grad - g).abs().max() < TOL


def test_stage_models_are_copies_and_bad_ranks_raise():
    problem = PipelineStack(stages=2)
    first = problem.stage(0).model
    with torch.no_grad():
        first[0].weight.zero_()
    assert problem.stage(0).model[0].weight.abs().sum() > 0
    with pytest.raises(ValueError, match="rank"):
        problem.stage(2)
    with pytest.raises(ValueError, match=">= 1"):
        PipelineStack(micro_batches=0)


@pytest.mark.parametrize("stages", [1, 3])
def test_the_boundaries_are_what_gpipe_sends_across_each_cut(stages):
    # Stage s's input for micro-batch k is stage s - 1's output on it; its gradient, through
    # the stages after it, sums with the others' to the reference's weight gradients.
    problem = PipelineStack(stages=stages, micro_batches=3, micro_batch=2, width=4, seed=1)
    activations, gradients = problem.boundaries()
    parts = [problem.stage(rank) for rank in range(stages)]
    for k in range(problem.micro_batches):
        assert torch.equal(activations[0][k], parts[0].inputs[k])
        x = activations[0][k]
        for s in range(1, stages):
            x = parts[s - 1].model(x).detach()
            assert (activations[s][k] - x).abs().max() < TOL
        last = activations[-1][k].clone().requires_grad_()
        loss = parts[-1].loss_sum(parts[-1].model(last), parts[-1].targets[k])
        (loss / problem.batch_size).backward()
        assert (gradients[-1][k] - last.grad).abs().max() < TOL
        assert all(g.shape == (2, 4) for g in (gradients[s][k] for s in range(stages)))
    if stages > 1:  # the gradient at a cut is the one after it, back through that stage
        x = activations[1][0].clone().requires_grad_()
        out = parts[1].model(x)
        out.backward(gradients[2][0])
        assert (gradients[1][0] - x.grad).abs().max() < TOL
