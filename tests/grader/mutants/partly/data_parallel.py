"""Partly right answers to 01 (data parallelism): each passes every visible check of its
exercise and fails a hidden case (unequal shards, other shapes, sizes, algorithms, noisy
times), written as a student who tried only the visible cases would write it."""

from tests.grader.mutants import bug
from tests.grader.mutants.heldout import partly

PARTLY = [
    # the visible shards are equal: the student divides by N times the first shard's size
    partly(
        bug(
            "data_parallel_step",
            "the total taken as N times the first shard's size (assumes equal shards)",
            "    total = sum(sizes)\n",
            "    total = len(shards) * sizes[0]  # every shard the same size\n",
        )
    ),
    # the visible gradients are 1-D: the results come back flat
    partly(
        bug(
            "ring_allreduce",
            "the results returned flat: the inputs' shape never restored",
            "    return [np.concatenate(row).reshape(shape) for row in chunks]",
            "    return [np.concatenate(row) for row in chunks]",
        )
    ),
    # the visible cases' winners are the same with the tree's depth rounded down
    partly(
        bug(
            "fastest_allreduce",
            "the tree's levels rounded down: int(log2 N) for ceil(log2 N)",
            "    rounds = math.ceil(math.log2(n))  # levels of a binomial tree",
            "    rounds = int(math.log2(n))  # levels of a binomial tree",
        )
    ),
    # the visible shards are equal: each rank's mean gradient, all-reduced, then averaged
    partly(
        bug(
            "naive_data_parallel",
            "each rank's mean loss, all-reduced, then divided by the number of ranks",
            "        (problem.loss_sum(model, x, y) / problem.global_batch).backward()\n"
            "        for p in model.parameters():\n"
            "            dist.all_reduce(p.grad)  # the sum of the shares is the global mean's "
            "gradient\n",
            "        loss = problem.loss_sum(model, x, y) / len(y)  # this rank's mean loss\n"
            "        loss.backward()\n"
            "        for p in model.parameters():\n"
            "            dist.all_reduce(p.grad)\n"
            "            p.grad /= world_size  # the mean of the ranks' means\n",
        )
    ),
    # the visible schedules all overlap: overlap=False never tried
    partly(
        bug(
            "backward_step_time",
            "the overlap flag ignored: every bucket starts when it is ready",
            "        start = max(ready if overlap else clock, network_free)\n",
            "        start = max(ready, network_free)\n",
        )
    ),
    # the visible cases use the ring and Rabenseifner on 64 workers: priced by hand for those
    partly(
        bug(
            "exposed_communication_s",
            "each bucket priced by hand: the ring, else Rabenseifner for a power of two",
            "    bucket_s = comm.allreduce_time(grad_bytes / num_buckets, world_size, "
            "bandwidth=bandwidth,\n"
            "                                   latency=latency, algorithm=algorithm)\n",
            "    n = world_size\n"
            '    latencies = 2 * (n - 1) if algorithm == "ring" else 2 * math.log2(n)\n'
            "    bucket_s = (latencies * latency\n"
            "                + 2 * (n - 1) / n * grad_bytes / num_buckets / bandwidth)\n",
        )
    ),
    # the visible runs have two equal shards: the local mean loss over N ranks
    partly(
        bug(
            "bucketed_data_parallel",
            "the loss divided by the local batch times the number of ranks (equal shards)",
            "        (problem.loss_sum(model, x, y) / problem.global_batch).backward()\n"
            "        for work, flat, bucket in in_flight:",
            "        (problem.loss_sum(model, x, y) / (len(y) * world_size)).backward()\n"
            "        for work, flat, bucket in in_flight:",
        )
    ),
    # the visible micro-batches are all of 2 rows: each divided by m N times its own size
    partly(
        bug(
            "accumulating_data_parallel",
            "each micro-batch's loss over m x N x its own rows (equal micro-batches assumed)",
            "            (problem.loss_sum(model, x, y) / problem.global_batch).backward()",
            "            scale = len(y) * problem.micro_batches * world_size\n"
            "            (problem.loss_sum(model, x, y) / scale).backward()",
        )
    ),
    # the visible timelines issue nothing before the first backward pass
    partly(
        bug(
            "read_timeline",
            "a transfer belongs to the last backward pass begun before it, else the first",
            "        mine = [t for t in transfers if begin <= t.issued_s < until]\n",
            "        mine = [t for t in transfers if t.issued_s < until\n"
            "                and (index == 0 or t.issued_s >= begin)]\n",
        )
    ),
    # the visible case has two examples, where n - 1 is 1
    partly(
        bug(
            "gradient_noise_scale",
            "tr(Sigma) as the summed squared deviations, never divided by n - 1",
            "    trace_sigma = ((g - mean) ** 2).sum() / (len(g) - 1)\n",
            "    trace_sigma = ((g - mean) ** 2).sum()\n",
        )
    ),
]
