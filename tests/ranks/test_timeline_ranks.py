"""distopt.ranks.timeline_ranks: the layer-by-layer overlapped run that exercise 10's test reads
(section 01), on real ranks and on the emulated link."""

import pytest

from distopt.problems.shards import ShardedProblem
from distopt.ranks import data_parallel_checks as checks
from distopt.ranks import timeline_ranks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NETWORK = dict(latency_s=10e-6, bandwidth_bytes_per_s=10e9, time_scale=100)


def test_layerwise_overlapped_sgd_trains_as_one_process_and_overlaps_each_layer():
    problem = ShardedProblem(shard_sizes=(5, 8, 6), layer_sizes=(6, 16, 16, 3), steps=3,
                             layer_backward_s=40e-6 * NETWORK["time_scale"])  # fmt: skip
    results = checks.run_on_link(timeline_ranks.layerwise_overlapped_sgd, problem, **NETWORK)
    checks.assert_weights_match([(w, log) for w, log, _ in results], problem.reference_sgd(),
                                what="one process")  # fmt: skip
    layers = len(checks.linear_layer_bytes(problem))
    for _, log, wire in results:
        assert len(wire.of("all_reduce")) == problem.steps * layers
        assert len(log.during_backward("all_reduce")) == problem.steps * layers
    # one bucket per layer: what the overlap simulator says for bucket_bytes=1
    checks.assert_overlapped_timeline(results, problem, 1)
