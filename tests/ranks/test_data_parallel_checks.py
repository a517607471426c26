"""distopt.ranks.data_parallel_checks and the bench inside real ranks: a rank gets its own
shard only, and the checks of message contents pass right answers and catch the shortcuts
that give the right weights and the right byte counts."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from distopt.engine import record
from distopt.problems.shards import ShardedProblem
from distopt.ranks import data_parallel_checks as checks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _peek(rank, world_size, problem, how):
    """A rank that asks the bench for what only another rank, or only the test, holds."""
    if how == "neighbour_shard":
        return problem.batch(0, (rank + 1) % world_size)
    if how == "neighbour_micro_batch":
        return problem.micro_batch(0, (rank + 1) % world_size, 0)
    return getattr(problem, how)(*((0,) if how == "global_batch_at" else ()))


@pytest.mark.parametrize(
    "how",
    [
        "neighbour_shard",
        "neighbour_micro_batch",
        "global_batch_at",
        "reference_sgd",
        "reference_adam",
        "reference_shares",
        "reference_adam_states",
    ],
)
def test_inside_a_rank_the_bench_answers_for_that_rank_only(how):
    problem = ShardedProblem(shard_sizes=(4, 4), steps=1)
    with pytest.raises(Exception, match="ForeignShardError") as raised:
        record.run_traced(_peek, problem, how)
    assert "your own rank only" in str(raised.value)


def _data_parallel(rank, world_size, problem, whole_batch=False, mean=False):
    """Plain data parallelism; ``whole_batch``: every rank trains on the whole global batch
    (rebuilt past the bench) and divides the all-reduced sum by N; ``mean``: each rank's mean
    loss, all-reduced and divided by N (right for equal shards)."""
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        if whole_batch:
            x, y = problem._global_batch(step)  # past the guard, as a copied generator would
            scale = problem.global_batch * world_size
        else:
            x, y = problem.batch(step, rank)
            scale = len(y) * world_size if mean else problem.global_batch
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / (len(y) if mean else problem.global_batch)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if whole_batch or mean:
                p.grad *= (len(y) if mean else problem.global_batch) / scale
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_own_shares_pass_whatever_the_constant_factor():
    problem = ShardedProblem(shard_sizes=(6, 6), steps=2)
    for mean in (False, True):
        results = checks.run_traced(_data_parallel, problem, False, mean)
        checks.assert_weights_match(results, problem.reference_sgd(), what="one process")
        checks.assert_own_shares_sent(results, problem)


def test_the_whole_batch_on_every_rank_is_named():
    problem = ShardedProblem(shard_sizes=(5, 3, 4), steps=2)
    results = checks.run_traced(_data_parallel, problem, True)
    checks.assert_weights_match(results, problem.reference_sgd(), what="one process")
    with pytest.raises(AssertionError, match="whole global batch's gradient"):
        checks.assert_own_shares_sent(results, problem)


def _zero1(rank, world_size, problem, gather_gradients=False):
    """ZeRO-1 Adam by hand; ``gather_gradients``: the gradient slices all-gathered instead and
    Adam run on the whole vector on every rank (same weights, same bytes, whole state)."""
    model = problem.new_model(rank)
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, src=0)
    num_params = sum(p.numel() for p in params)
    shard = -(-num_params // world_size)
    size = shard * world_size if gather_gradients else shard
    m, v = torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64)
    mine = slice(rank * shard, (rank + 1) * shard)
    for step in range(1, problem.steps + 1):
        x, y = problem.batch(step - 1, rank)
        model.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        flat = torch.zeros(shard * world_size, dtype=torch.float64)
        flat[:num_params] = parameters_to_vector([p.grad for p in params])
        grad = torch.empty(shard, dtype=torch.float64)
        dist.reduce_scatter_tensor(grad, flat)
        weights = torch.zeros(shard * world_size, dtype=torch.float64)
        weights[:num_params] = parameters_to_vector(params).detach()
        if gather_gradients:
            dist.all_gather_into_tensor(flat, grad)
            grad, region = flat, slice(None)
        else:
            region = mine
        m.mul_(0.9).add_(grad, alpha=0.1)
        v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        update = problem.adam_lr * (m / (1 - 0.9**step)) / ((v / (1 - 0.999**step)).sqrt() + 1e-8)
        new = weights[region] - update
        if not gather_gradients:
            dist.all_gather_into_tensor(weights, new.contiguous())
            new = weights
        with torch.no_grad():
            vector_to_parameters(new[:num_params], params)
    moments = [m[mine].clone(), v[mine].clone()] if gather_gradients else [m, v]
    return [p.detach() for p in params], moments


def test_zero1_state_passes_the_sharded_answer_and_catches_gathered_gradients():
    problem = ShardedProblem(shard_sizes=(5, 6, 4), steps=3)
    right = checks.run_traced(_zero1, problem)
    checks.assert_weights_match(right, problem.reference_adam(), what="torch.optim.Adam")
    checks.assert_zero1_state(right, problem)
    wrong = checks.run_traced(_zero1, problem, True)
    checks.assert_weights_match(wrong, problem.reference_adam(), what="torch.optim.Adam")
    assert [log.payload_bytes("all_gather_into_tensor") for _, log in wrong] == [
        log.payload_bytes("all_gather_into_tensor") for _, log in right
    ]
    with pytest.raises(AssertionError, match="updated weights"):
        checks.assert_zero1_state(wrong, problem)
