"""distopt.ranks.data_parallel_checks and the bench inside real ranks: a rank gets its own
shard only, and the checks of message contents pass right answers and catch the shortcuts
that give the right weights and the right byte counts."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from distopt import launch
from distopt.costs import comm
from distopt.engine import link, record
from distopt.problems.own_data import ForeignShardError
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


def _peek_built(rank, world_size, shard_sizes, how):
    """As :func:`_peek`, on a whole problem the rank builds itself (as with a guessed seed)."""
    return _peek(rank, world_size, ShardedProblem(shard_sizes=shard_sizes, steps=1), how)


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
        "reference_adam_shares",
    ],
)
def test_inside_a_rank_the_bench_answers_for_that_rank_only(how):
    """A whole problem that a rank builds itself refuses it another rank's data (no whole
    problem reaches a rank: a launch ships each rank its own part, next test)."""
    with pytest.raises(Exception, match="ForeignShardError") as raised:
        launch(record.traced(_peek_built), 2, (4, 4), how)
    assert "your own rank only" in str(raised.value)


@pytest.mark.parametrize("how", ["neighbour_shard", "neighbour_micro_batch", "new_model"])
def test_the_part_a_check_ships_answers_for_its_rank_only(how):
    problem = ShardedProblem(shard_sizes=(4, 4), steps=1)
    if how == "new_model":  # rank 0's starting model, asked for on rank 1
        with pytest.raises(Exception, match="ForeignShardError") as raised:
            checks.run_traced(lambda rank, n, part: part.new_model(0), problem)
        assert "rank 1 asked for rank 0's starting model" in str(raised.value)
        return
    with pytest.raises(Exception, match="ForeignShardError") as raised:
        checks.run_traced(_peek, problem, how)
    assert "your own rank only" in str(raised.value)
    part = problem.own_part(0)
    assert not hasattr(part, "seed")
    for gone in ("global_batch_at", "reference_sgd", "_rows", "_run"):  # refused by name
        with pytest.raises(ForeignShardError, match=f"ShardedProblem.{gone}"):
            getattr(part, gone)


def _retyped_global_batch(problem, step, seed):
    """The bench's generator of a whole step, typed again with a seed the rank was told (its
    part holds none, and every private method of the bench refuses)."""
    import numpy as np

    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((problem.global_batch, problem.layer_sizes[0]))
    teacher = np.random.default_rng(seed + 99).standard_normal(
        (problem.layer_sizes[0], problem.layer_sizes[-1])
    )
    y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((len(x), teacher.shape[1])), 1)
    return torch.from_numpy(x), torch.from_numpy(y)


def _data_parallel(rank, world_size, problem, whole_batch=None, mean=False):
    """Plain data parallelism; ``whole_batch`` (a seed): every rank trains on the whole global
    batch (rebuilt past the bench from that seed) and divides the all-reduced sum by N;
    ``mean``: each rank's mean loss, all-reduced and divided by N (right for equal shards)."""
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        if whole_batch is not None:
            x, y = _retyped_global_batch(problem, step, whole_batch)  # a copied generator
            scale = problem.global_batch * world_size
        else:
            x, y = problem.batch(step, rank)
            scale = len(y) * world_size if mean else problem.global_batch
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / (len(y) if mean else problem.global_batch)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if whole_batch is not None or mean:
                p.grad *= (len(y) if mean else problem.global_batch) / scale
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_own_shares_pass_whatever_the_constant_factor():
    problem = ShardedProblem(shard_sizes=(6, 6), steps=2)
    for mean in (False, True):
        results = checks.run_traced(_data_parallel, problem, None, mean)
        checks.assert_weights_match(results, problem.reference_sgd(), what="one process")
        checks.assert_own_shares_sent(results, problem)


def test_the_whole_batch_on_every_rank_is_named():
    problem = ShardedProblem(shard_sizes=(5, 3, 4), steps=2)
    results = checks.run_traced(_data_parallel, problem, problem.seed)
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


def _per_layer_buckets(rank, world_size, problem, wait_in_hook=False):
    """One all-reduce per Linear layer, started from a hook when its weight's gradient is
    ready (bias first: autograd accumulates both together); ``wait_in_hook``: the backward
    pass waits for each (the right weights and calls, no overlap)."""
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    works = []

    def send(layer):
        def hook(param):
            flat = torch.cat([layer.bias.grad, layer.weight.grad.flatten()])
            work = dist.all_reduce(flat, async_op=True)
            if wait_in_hook:
                work.wait()
            works.append((work, flat, layer))

        return hook

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.weight.register_post_accumulate_grad_hook(send(layer))
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for work, flat, layer in works:
            work.wait()
            layer.bias.grad.copy_(flat[: layer.bias.numel()])
            layer.weight.grad.copy_(flat[layer.bias.numel() :].view_as(layer.weight))
        works.clear()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_the_timeline_check_passes_overlap_and_catches_a_backward_that_waits():
    problem = ShardedProblem(shard_sizes=(4, 4), layer_sizes=(4, 32, 32, 2), steps=2,
                             layer_backward_s=40e-6 * 200)  # fmt: skip
    network = dict(latency_s=10e-6, bandwidth_bytes_per_s=10e9, time_scale=200)
    right = checks.run_on_link(_per_layer_buckets, problem, **network)
    reference = problem.reference_sgd()
    checks.assert_weights_match([r[:2] for r in right], reference, what="one process")
    exposed = checks.assert_overlapped_timeline(right, problem, 1)
    assert [len(rank) for rank in exposed] == [2, 2]  # each rank's exposed seconds per step
    assert all(s >= 0 for rank in exposed for s in rank)
    waiting = checks.run_on_link(_per_layer_buckets, problem, True, **network)
    checks.assert_weights_match([r[:2] for r in waiting], reference, what="one process")
    with pytest.raises(AssertionError, match="wait inside a hook"):
        checks.assert_overlapped_timeline(waiting, problem, 1)


def test_the_simulators_exposed_time_is_the_last_buckets_while_the_network_keeps_up():
    problem = ShardedProblem(shard_sizes=(4, 4), layer_sizes=(4, 32, 32, 2), steps=2,
                             layer_backward_s=1.0)  # fmt: skip
    wire = link.Link(10e-6, 10e9, 200)
    first_layer = checks.linear_layer_bytes(problem)[0]
    assert checks.linear_layer_bytes(problem) == [(4 * 32 + 32) * 8, (32 * 32 + 32) * 8, 66 * 8]
    assert math.isclose(
        checks.modelled_exposed_s(problem, 1, wire),
        200 * comm.allreduce_time(first_layer, 2, bandwidth=10e9, latency=10e-6),
    )


def _timeline(problem, wire, *, overshoot_s, return_after_s, wait_in_hook=False):
    """A right bucketed run's logs as a busy machine stretches them (issue 59): one all-
    reduce per layer, each issued when its layer's emulated compute (stretched by
    ``overshoot_s``) ends; ``backward()`` returns ``return_after_s`` after the last hook;
    each result is handed back after the backward pass, or (``wait_in_hook``) at once."""
    layer_bytes = checks.linear_layer_bytes(problem)
    transfers, backward, clock, free = [], [], 1.0, 0.0
    for _ in range(problem.steps):
        begin = clock
        for size in reversed(layer_bytes):
            clock += problem.layer_backward_s + overshoot_s
            start = max(clock, free)
            free = start + wire.duration_s("all_reduce", size, 2)
            transfers.append(link.Transfer("all_reduce", size, 2, True, clock, start, free, 0.0))
            if wait_in_hook:
                clock = transfers[-1].waited_s = free
        clock += return_after_s
        backward.append((begin, clock))
        for transfer in transfers[-len(layer_bytes) :]:
            if transfer.waited_s is None:
                transfer.waited_s = clock = max(clock, transfer.end_s)
        clock += 0.01  # the optimizer, the next forward pass
    wire.transfers.extend(transfers)
    return [(None, record.Recording(backward=backward), wire)]


def test_the_timeline_check_reads_the_emulations_clock_not_the_machines_load():
    problem = ShardedProblem(shard_sizes=(4, 4), layer_sizes=(4, 32, 32, 2), steps=2,
                             layer_backward_s=40e-6 * 200)  # fmt: skip
    last_s = 200 * comm.allreduce_time(checks.linear_layer_bytes(problem)[0], 2, bandwidth=10e9,
                                       latency=10e-6)  # fmt: skip
    # a busy machine: sleeps 5 ms late, backward() returns 6 ms after the last hook, longer
    # than the last all-reduce (about 4 ms): read from the wall, nothing would look exposed
    busy = _timeline(problem, link.Link(10e-6, 10e9, 200), overshoot_s=5e-3, return_after_s=6e-3)
    exposed = checks.assert_overlapped_timeline(busy, problem, 1)
    assert all(math.isclose(s, last_s) for s in exposed[0]), (exposed, last_s)
    # a backward pass that waits in its hooks is caught by when it had the results back
    waiting = _timeline(problem, link.Link(10e-6, 10e9, 200), overshoot_s=0.0,
                        return_after_s=1e-4, wait_in_hook=True)  # fmt: skip
    with pytest.raises(AssertionError, match="wait inside a hook"):
        checks.assert_overlapped_timeline(waiting, problem, 1)


def _zero1_decoy(rank, world_size, problem):
    """Zeros of the right size reduce-scattered; the gradients moved by ``dist.all_gather``
    (a list, which the byte checks of the exercise do not read) and full Adam on every rank;
    the right slice all-gathered and the right moments returned."""
    model = problem.new_model(rank)
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, src=0)
    num_params = sum(p.numel() for p in params)
    shard = -(-num_params // world_size)
    padded = shard * world_size
    m, v = torch.zeros(padded, dtype=torch.float64), torch.zeros(padded, dtype=torch.float64)
    mine = slice(rank * shard, (rank + 1) * shard)
    for step in range(1, problem.steps + 1):
        x, y = problem.batch(step - 1, rank)
        model.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        own = torch.zeros(padded, dtype=torch.float64)
        own[:num_params] = parameters_to_vector([p.grad for p in params])
        dist.reduce_scatter_tensor(torch.empty(shard, dtype=torch.float64), own * 0)
        pieces = [torch.empty(padded, dtype=torch.float64) for _ in range(world_size)]
        dist.all_gather(pieces, own)
        grad = sum(pieces)
        m.mul_(0.9).add_(grad, alpha=0.1)
        v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        weights = torch.zeros(padded, dtype=torch.float64)
        weights[:num_params] = parameters_to_vector(params).detach()
        weights -= problem.adam_lr * (m / (1 - 0.9**step)) / ((v / (1 - 0.999**step)).sqrt() + 1e-8)
        dist.all_gather_into_tensor(weights, weights[mine].clone())
        with torch.no_grad():
            vector_to_parameters(weights[:num_params], params)
    return [p.detach() for p in params], [m[mine].clone(), v[mine].clone()]


def test_zero1_reduce_scatter_must_carry_the_own_gradient_on_adams_trajectory():
    problem = ShardedProblem(shard_sizes=(3, 5), steps=2)
    right = checks.run_traced(_zero1, problem)
    checks.assert_zero1_state(right, problem)  # the honest answer's payloads pass
    decoy = checks.run_traced(_zero1_decoy, problem)
    checks.assert_weights_match(decoy, problem.reference_adam(), what="Adam")  # right weights
    with pytest.raises(AssertionError, match="reduce_scatter_tensor are not the padded flat"):
        checks.assert_zero1_state(decoy, problem)


def _accumulating(rank, world_size, problem, how="right"):
    """Accumulation by micro-batches; ``how``: "whole" runs the whole shard at once and pads
    the count of backward passes with empty ones; "zeros" forwards zero inputs of the
    micro-batches' sizes for show."""
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        if how == "right":
            for k in range(problem.micro_batches):
                x, y = problem.micro_batch(step, rank, k)
                (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        else:
            x, y = problem.batch(step, rank)
            (problem.loss_sum(model, x, y) / problem.global_batch).backward()
            for k in range(problem.micro_batches - 1):
                if how == "zeros":
                    size = len(problem.micro_batch(step, rank, k)[1])
                    (0.0 * model(torch.zeros(size, x.shape[1], dtype=x.dtype)).sum()).backward()
                else:
                    (0.0 * sum(p.sum() for p in model.parameters())).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("how", ["whole", "zeros"])
def test_accumulation_is_checked_by_the_forward_passes_of_the_micro_batches(how):
    problem = ShardedProblem(shard_sizes=(4, 6), steps=2, micro_batches=2)
    right = checks.run_traced(_accumulating, problem)
    checks.assert_own_shares_sent(right, problem)
    assert [len(log.forwards) for _, log in right] == [4, 4]  # steps x micro-batches
    shortcut = checks.run_traced(_accumulating, problem, how)
    checks.assert_weights_match(shortcut, problem.reference_sgd(), what="one process")
    with pytest.raises(AssertionError, match="forward pass"):
        checks.assert_own_shares_sent(shortcut, problem)


def _scaled_per_step(rank, world_size, problem):
    """Right weights, but each step's gradient all-reduced times a factor of that step (and
    divided back): the numbers sent are not one scaling of the own gradient."""
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            p.grad *= step + 1
            dist.all_reduce(p.grad)
            p.grad /= step + 1
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_the_shares_are_checked_step_by_step_with_one_factor():
    problem = ShardedProblem(shard_sizes=(4, 4), steps=2)
    results = checks.run_traced(_scaled_per_step, problem)
    checks.assert_weights_match(results, problem.reference_sgd(), what="one process")
    with pytest.raises(AssertionError, match="a different factor"):
        checks.assert_own_shares_sent(results, problem)
