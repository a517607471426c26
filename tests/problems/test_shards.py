"""distopt.problems.shards: the data-parallel bench, its single-process answers, and what
each message of correct rank code must carry."""

import time

import pytest
import torch

from distopt.problems.own_data import ForeignShardError, refuse_inside_ranks, refuse_other_rank
from distopt.problems.shards import ShardedProblem, flat

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plain_run(problem: ShardedProblem, make_optimizer) -> tuple[list, torch.optim.Optimizer]:
    model = problem.new_model(0)
    optimizer = make_optimizer(model.parameters())
    for step in range(problem.steps):
        x, y = problem.global_batch_at(step)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()], optimizer


def test_the_shards_of_a_step_make_up_its_global_batch():
    problem = ShardedProblem(shard_sizes=(5, 11, 2), micro_batches=2, seed=3)
    for step in range(problem.steps):
        x, y = problem.global_batch_at(step)
        shards = [problem.batch(step, r) for r in range(problem.world_size)]
        assert torch.equal(torch.cat([s[0] for s in shards]), x)
        assert torch.equal(torch.cat([s[1] for s in shards]), y)
        micro = [problem.micro_batch(step, 1, k) for k in range(2)]
        assert torch.equal(torch.cat([m[0] for m in micro]), shards[1][0])


def test_the_reference_answers_are_plain_single_process_training():
    problem = ShardedProblem(shard_sizes=(5, 11, 2), steps=3, seed=2)
    sgd, _ = _plain_run(problem, lambda params: torch.optim.SGD(params, lr=problem.lr))
    assert all(torch.equal(a, b) for a, b in zip(problem.reference_sgd(), sgd, strict=True))
    adam, optimizer = _plain_run(problem, lambda ps: torch.optim.Adam(ps, lr=problem.adam_lr))
    assert all(torch.equal(a, b) for a, b in zip(problem.reference_adam(), adam, strict=True))
    last = problem.reference_adam_states()[-1]
    params = list(optimizer.state)
    assert torch.equal(last["weights"], flat(adam))
    assert torch.equal(last["exp_avg"], flat([optimizer.state[p]["exp_avg"] for p in params]))
    assert torch.equal(last["exp_avg_sq"], flat([optimizer.state[p]["exp_avg_sq"] for p in params]))


def test_the_ranks_shares_add_up_to_each_steps_gradient():
    problem = ShardedProblem(shard_sizes=(5, 11, 2), steps=3, seed=2)
    shares = problem.reference_shares()
    num_params = sum(p.numel() for p in problem.new_model().parameters())
    assert shares.shape == (3, 3, num_params)
    model = problem.new_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.global_batch_at(step)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        whole = flat([p.grad for p in model.parameters()])
        assert torch.allclose(shares[step].sum(dim=0), whole, rtol=0, atol=1e-15)
        assert not torch.allclose(shares[step, 0], whole / 3, atol=1e-6)  # the shards differ
        optimizer.step()


def test_the_guards_are_open_outside_a_process_group():
    refuse_other_rank(3, "shard", "never raised here")
    refuse_inside_ranks("problem.reference_sgd()", "never raised here")
    assert issubclass(ForeignShardError, PermissionError)


def test_emulated_compute_sleeps_in_each_layers_backward_before_its_gradients(monkeypatch):
    problem = ShardedProblem(shard_sizes=(4, 4), layer_sizes=(3, 5, 5, 2), layer_backward_s=0.01)
    model = problem.new_model(0)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    ready = {}

    def when_ready(index):
        def hook(param):
            ready[index] = time.perf_counter()

        return hook

    for index, layer in enumerate(layers):
        layer.weight.register_post_accumulate_grad_hook(when_ready(index))
    x, y = problem.global_batch_at(0)
    start = time.perf_counter()
    problem.loss_sum(model, x, y).backward()
    # the last layer's gradient after one sleep, the first layer's after three
    assert sorted(ready, key=ready.get) == [2, 1, 0]
    for index, after in ((2, 1), (1, 2), (0, 3)):
        assert ready[index] - start >= after * 0.01, (index, ready[index] - start)
    # the same weights as without it, and the baselines never sleep
    plain = ShardedProblem(shard_sizes=(4, 4), layer_sizes=(3, 5, 5, 2))
    twin = plain.new_model(0).parameters()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin, strict=True))
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    problem.reference_sgd()
    assert slept == []
    with pytest.raises(ValueError, match="layer_backward_s"):
        ShardedProblem(layer_backward_s=-1.0)
