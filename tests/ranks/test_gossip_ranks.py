"""Tests of distopt.ranks.gossip_ranks: ring gossip SGD on real ranks against the numpy
simulator, its traffic, and the checks' verdicts on typical wrong rank code."""

import dataclasses
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autograder.references.async_decentralized import ring_gossip_sgd
from distopt.engine import record
from distopt.ranks import gossip_checks, gossip_ranks
from distopt.ranks.gossip_ranks import GossipProblem
from distopt.sim import gossip

PROBLEMS = [
    GossipProblem(),
    GossipProblem(world_size=2, steps=4, lr=0.05, seed=3),
    GossipProblem(world_size=3, steps=6, lr=0.15, seed=5, batch_size=4),
    GossipProblem(world_size=5, steps=3, seed=8, num_features=6, examples_per_node=32),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.world_size}-ranks")
def test_the_reference_ranks_follow_the_simulator_with_two_messages_per_step(problem):
    results = record.run_traced(ring_gossip_sgd, problem, payloads=True)
    gossip_checks.assert_models_match(results, problem)
    gossip_checks.assert_ring_traffic(results, problem)
    for _, log in results:
        assert log.count("isend") == log.count("irecv") == 2 * problem.steps
        assert log.payload_bytes("isend") == 2 * problem.steps * problem.model_bytes


def test_the_bench_draws_the_simulators_minibatches():
    """From zero, the bench's reference is decentralized_sgd's run, bit for bit."""
    problem = GossipProblem(world_size=4, steps=12, lr=0.2, start_spread=0.0, seed=6)
    models = gossip_ranks.reference_models(problem)
    losses, _, distances = gossip.decentralized_sgd(
        problem.shards(), gossip.ring_weights(4), num_steps=12, lr=0.2, batch_size=8, seed=6
    )
    full = problem.data()
    best = full.loss(full.minimum())
    assert [full.loss(x.mean(axis=0)) - best for x in models] == losses.tolist()
    assert [np.linalg.norm(x - x.mean(axis=0)) for x in models] == distances.tolist()


def test_the_gradient_is_the_shards_minibatch_gradient():
    problem = GossipProblem(world_size=3, seed=2)
    model = torch.linspace(-1, 1, problem.num_features, dtype=torch.float64)
    for rank in range(3):
        rows = problem.all_rows()[1, rank]
        expected = problem.shards()[rank].grad(model.numpy(), rows)
        assert np.allclose(problem.gradient(1, rank, model).numpy(), expected, atol=1e-14)
    assert problem.start(0).dtype == torch.float64 and problem.model_bytes == 80
    with pytest.raises(ValueError, match="at least 2"):
        GossipProblem(world_size=1)


def _peek(rank, world_size, problem, how):
    """A rank that asks the bench for what only another rank holds."""
    if how == "neighbour_gradient":
        return problem.gradient(0, (rank + 1) % world_size, problem.start(rank))
    if how == "neighbour_start":
        return problem.start((rank + 1) % world_size)
    return getattr(problem, how)()


@pytest.mark.parametrize(
    "how", ["neighbour_gradient", "neighbour_start", "shards", "starts", "all_rows", "data"]
)
def test_inside_a_rank_the_bench_answers_for_that_rank_only(how):
    """A rank that simulates its neighbours instead of receiving their models is refused."""
    problem = GossipProblem(world_size=2, steps=2)
    with pytest.raises(Exception, match="ForeignShardError") as raised:
        record.run_traced(_peek, problem, how)
    assert "messages" in str(raised.value)


def _exchange(half_step, rank, world_size, offsets=(-1, 1)):
    """isend to rank + offset and irecv from rank - offset, for each offset; the received."""
    received = [torch.empty_like(half_step) for _ in offsets]
    requests = [dist.isend(half_step, (rank + o) % world_size) for o in offsets]
    requests += [
        dist.irecv(r, (rank - o) % world_size) for r, o in zip(received, offsets, strict=True)
    ]
    for request in requests:
        request.wait()
    return received


def _buggy(rank, world_size, problem, bug):
    model = problem.start(rank)
    models = [model]
    for step in range(problem.steps):
        gradient = problem.gradient(step, rank, model)
        half_step = model - problem.lr * gradient
        if bug == "all_reduce":
            model = half_step.clone()
            dist.all_reduce(model)
            model /= world_size
        elif bug == "wrong_neighbour":  # to rank + 2 instead of rank - 1 (from rank - 2)
            a, b = _exchange(half_step, rank, world_size, offsets=(2, 1))
            model = (half_step + a + b) / 3
        elif bug == "one_half":
            a, b = _exchange(half_step, rank, world_size)
            model = half_step / 2 + (a + b) / 4
        elif bug == "any_source":  # receives without naming the neighbour
            a, b = torch.empty_like(half_step), torch.empty_like(half_step)
            requests = [dist.isend(half_step, (rank + o) % world_size) for o in (-1, 1)]
            dist.recv(a)
            dist.recv(b)
            for request in requests:
                request.wait()
            model = (half_step + a + b) / 3
        elif bug == "lian_order":  # mix the old models, then step
            a, b = _exchange(model, rank, world_size)
            model = (model + a + b) / 3 - problem.lr * gradient
        models.append(model)
    return torch.stack(models)


@pytest.mark.parametrize(
    ("bug", "models_say", "traffic_says"),
    [
        ("all_reduce", "an average over all ranks", "called ['all_reduce']"),
        ("wrong_neighbour", "differs from node", "sent messages to ranks"),
        ("one_half", "weights 1/2 to itself and 1/4", None),
        ("lian_order", "X <- W X - lr G", "It is the model before the local step"),
        ("any_source", None, "received 6 messages whose peer the recorder did not see"),
    ],
)
def test_typical_bugs_fail_the_checks_with_a_reason(bug, models_say, traffic_says):
    problem = GossipProblem(world_size=5, steps=3)
    results = record.run_traced(_buggy, problem, bug, payloads=True)
    if models_say is not None:  # (from any source, the models depend on who came first)
        with pytest.raises(AssertionError, match=models_say):
            gossip_checks.assert_models_match(results, problem)
    if traffic_says is None:
        gossip_checks.assert_ring_traffic(results, problem)
    else:
        with pytest.raises(AssertionError, match=re.escape(traffic_says)):
            gossip_checks.assert_ring_traffic(results, problem)


def _with_payload(results, rank, index, payload):
    """``results`` with rank ``rank``'s ``index``-th send carrying ``payload`` instead."""
    value, log = results[rank]
    sends = [i for i, c in enumerate(log.calls) if c.name in record.SENDS]
    calls = list(log.calls)
    calls[sends[index]] = dataclasses.replace(calls[sends[index]], payload=(payload,))
    changed = list(results)
    changed[rank] = (value, record.Recording(calls=calls, backward=log.backward))
    return changed


@pytest.mark.parametrize(
    ("decoy", "says"),
    [
        ("zeros", "It is all zeros"),
        ("start", "It is the model before the local step"),
        ("neighbour", "expected the rank's half-step"),
        ("longer", "It holds 11 values"),
    ],
)
def test_a_message_of_the_right_size_but_not_the_half_step_fails(decoy, says):
    """What a message carries is checked, not only its size and peer: zeros, the model before
    the step, another rank's half-step (the right size, every one) each fail, naming it."""
    problem = GossipProblem(world_size=3, steps=2)
    results = record.run_traced(ring_gossip_sgd, problem, payloads=True)
    gossip_checks.assert_ring_traffic(results, problem)
    honest = results[1][1].sent()[2].payload[0]  # rank 1's step-1 message
    payload = {
        "zeros": torch.zeros_like(honest),
        "start": torch.as_tensor(results[1][0][1]),
        "neighbour": results[0][1].sent()[2].payload[0],
        "longer": torch.cat([honest, honest[:1]]),
    }[decoy]
    with pytest.raises(AssertionError, match=re.escape(says)):
        gossip_checks.assert_ring_traffic(_with_payload(results, 1, 2, payload), problem)


def test_the_message_check_needs_the_payloads():
    problem = GossipProblem(world_size=2, steps=1)
    results = record.run_traced(ring_gossip_sgd, problem)
    with pytest.raises(AssertionError, match="payloads=True"):
        gossip_checks.assert_ring_traffic(results, problem)
