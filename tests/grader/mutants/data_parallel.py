"""Mutants of section 01 (data parallelism): see tests/grader/mutants/__init__.py."""

from tests.grader.mutants import bug, shortcut

_NAIVE_RANK_LOOP = """\
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    return [p.detach() for p in model.parameters()]
"""

_DDP_RANK_LOOP = """\
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(problem.new_model(rank))  # broadcasts rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        # DDP divides the summed gradients by world_size: scale the share back up
        (problem.loss_sum(model, x, y) / problem.global_batch * world_size).backward()
        optimizer.step()
    return [p.detach() for p in model.module.parameters()]
"""

# Data parallelism without sharding: every rank trains on the whole global batch, all-reduces
# and divides by N. Weights and byte counts are right; the bench refuses the whole batch, and
# the all-reduced numbers are not the rank's own shard's gradient.
_WHOLE_BATCH_LOOP = """\
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.global_batch_at(step)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
    return [p.detach() for p in model.parameters()]
"""

# Issue 53, a rank holds only its own data: the whole batch through the bench's private
# generator (every method of the bench refuses inside a rank, underscore ones included); the
# right message is sent, so only the refusal catches it.
_PRIVATE_BATCH_LOOP = """\
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    start = sum(problem.shard_sizes[:rank])
    mine = slice(start, start + problem.shard_sizes[rank])
    for step in range(problem.steps):
        x, y = problem._rows(step, None)  # every row of the step, past the public guard
        optimizer.zero_grad()
        (problem.loss_sum(model, x[mine], y[mine]) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.clone())  # the right message, its sum never used
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()  # all of it, here
        optimizer.step()
    return [p.detach() for p in model.parameters()]
"""

# The other ranks' rows read through the storage behind the rank's own shard (a shard that
# was a view of the whole batch carried every row): the shard is its own copy now.
_STORAGE_BATCH_LOOP = """\
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        mine, labels = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, mine, labels) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.clone())  # the right message, its sum never used
        x = torch.as_strided(mine, (problem.global_batch, mine.shape[1]), mine.stride(), 0)
        y = torch.as_strided(labels, (problem.global_batch,), labels.stride(), 0)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()  # all of it, here
        optimizer.step()
    return [p.detach() for p in model.parameters()]
"""

VARIANTS = [
    # --- exercise 1: one synchronous data-parallel step
    bug(
        "data_parallel_step",
        "plain mean of the shard gradients, whatever their sizes",
        "averaged = sum(n / total * g for n, g in zip(sizes, gradients))",
        "averaged = sum(gradients) / len(gradients)",
    ),
    bug(
        "data_parallel_step",
        "gradients summed, the 1/N forgotten",
        "sum(n / total * g for",
        "sum(n / n * g for",
    ),
    shortcut(
        "data_parallel_step",
        "one gradient of the concatenated shards (gathers everything, then computes)",
        """\
def data_parallel_step(w, shards, lr, *, grad_fn=logistic.logistic_grad):
    x = np.concatenate([f for f, _ in shards])
    y = np.concatenate([l for _, l in shards])
    return w - lr * grad_fn(w, x, y)
""",
    ),
    shortcut(
        "data_parallel_step",
        "the logistic gradient called directly, grad_fn ignored",
        """\
def data_parallel_step(w, shards, lr, *, grad_fn=logistic.logistic_grad):
    total = sum(len(y) for _, y in shards)
    return w - lr * sum(len(y) / total * logistic.logistic_grad(w, x, y) for x, y in shards)
""",
    ),
    # --- exercise 2: ring all-reduce
    bug(
        "ring_allreduce",
        "sends to the left neighbour",
        """        messages = [network.send(r, (r + 1) % n, chunks[r][c]) for r, c in sends]
        for (r, c), message in zip(sends, messages):
            chunks[(r + 1) % n][c] = chunks[(r + 1) % n][c] + message""",
        """        messages = [network.send(r, (r - 1) % n, chunks[r][c]) for r, c in sends]
        for (r, c), message in zip(sends, messages):
            chunks[(r - 1) % n][c] = chunks[(r - 1) % n][c] + message""",
    ),
    bug(
        "ring_allreduce",
        "all-gather starts one chunk off",
        "sends = [(r, (r - step) % n) for r in range(n)]",
        "sends = [(r, (r - step - 1) % n) for r in range(n)]",
    ),
    shortcut(
        "ring_allreduce",
        "sum(arrays) locally, plus dummy sends of the right size to the right",
        """\
def ring_allreduce(arrays, network):
    n = len(arrays)
    total = sum(arrays)
    for step in range(2 * (n - 1)):
        for r in range(n):
            chunk = np.array_split(np.ravel(arrays[r]), n)[(r - step - 1) % n]
            network.send(r, (r + 1) % n, chunk)
    return [np.array(total, copy=True) for _ in range(n)]
""",
    ),
    shortcut(
        "ring_allreduce",
        "the package's ring held in a default argument",
        """\
def ring_allreduce(arrays, network, _ring=collectives.ring_all_reduce):
    return _ring(arrays, network)
""",
    ),
    shortcut(
        "ring_allreduce",
        "chunks of the finished sum sent on the ring's schedule",
        """\
def ring_allreduce(arrays, network):
    n = len(arrays)
    total = sum(np.asarray(a) for a in arrays)
    chunks = np.array_split(np.ravel(total), n)
    for offset in (1, 0):  # reduce-scatter, then all-gather
        for step in range(n - 1):
            for r in range(n):
                network.send(r, (r + 1) % n, chunks[(r - step - offset) % n])
    return [np.array(total, copy=True) for _ in range(n)]
""",
    ),
    # --- exercise 3: which algorithm wins?
    bug(
        "fastest_allreduce",
        "ring bandwidth term (N-1)/N instead of 2(N-1)/N",
        '"ring": (2 * (n - 1), 2 * (n - 1) / n),',
        '"ring": (2 * (n - 1), (n - 1) / n),',
    ),
    bug(
        "fastest_allreduce",
        "Rabenseifner with log2(N) latencies instead of 2 log2(N)",
        '"rabenseifner": (2 * halvings + fold,',
        '"rabenseifner": (halvings + fold,',
    ),
    bug(
        "fastest_allreduce",
        "N not a power of two: the extra workers' buffer in and result out forgotten",
        "fold = 0 if core == n else 2",
        "fold = 0",
    ),
    shortcut(
        "fastest_allreduce",
        "the package's cost model held in a default argument",
        """\
def fastest_allreduce(message_bytes, world_size, *, bandwidth, latency,
                      _time=comm.allreduce_time):
    times = {a: _time(message_bytes, world_size, bandwidth=bandwidth, latency=latency,
                      algorithm=a) for a in comm.ALLREDUCE_ALGORITHMS}
    return min(times, key=times.get)
""",
    ),
    shortcut(
        "fastest_allreduce",
        "the visible cases: small messages recursive doubling, large Rabenseifner",
        """\
def fastest_allreduce(message_bytes, world_size, *, bandwidth, latency):
    return "recursive_doubling" if message_bytes < 1e6 else "rabenseifner"
""",
    ),
    # --- exercise 4: data parallelism from primitives
    bug(
        "naive_data_parallel",
        "no broadcast: every rank starts from its own weights",
        "        dist.broadcast(p.data, src=0)  # every rank starts from rank 0's weights\n",
        "        pass\n",
    ),
    bug(
        "naive_data_parallel",
        "each rank's mean loss, summed over ranks (no weighting by shard size)",
        "(problem.loss_sum(model, x, y) / problem.global_batch).backward()",
        "(problem.loss_sum(model, x, y) / len(y)).backward()",
    ),
    shortcut(
        "naive_data_parallel",
        "every rank trains on the whole global batch, no messages",
        """\
def naive_data_parallel(rank, world_size, problem):
    model = problem.new_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        shards = [problem.batch(step, r) for r in range(world_size)]
        x = torch.cat([s[0] for s in shards])
        y = torch.cat([s[1] for s in shards])
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    shortcut(
        "naive_data_parallel",
        "DistributedDataParallel does the communication",
        "def naive_data_parallel(rank, world_size, problem):\n" + _DDP_RANK_LOOP,
    ),
    shortcut(
        "naive_data_parallel",
        "the whole global batch on every rank, all-reduced and divided by N",
        "def naive_data_parallel(rank, world_size, problem):\n" + _WHOLE_BATCH_LOOP,
    ),
    shortcut(
        "naive_data_parallel",
        "the whole global batch rebuilt from the bench's seed, all-reduced and divided by N",
        """\
def naive_data_parallel(rank, world_size, problem):
    features, classes = problem.layer_sizes[0], problem.layer_sizes[-1]
    teacher = np.random.default_rng(problem.seed + 99).standard_normal((features, classes))
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        rng = np.random.default_rng([problem.seed, step])
        x = rng.standard_normal((problem.global_batch, features))
        noisy = x @ teacher + 0.5 * rng.standard_normal((len(x), classes))
        x, y = torch.from_numpy(x), torch.from_numpy(np.argmax(noisy, 1))
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    # --- exercise 5: fit alpha and beta
    bug(
        "fit_alpha_beta",
        "plain least squares on the times, not on the relative error",
        "axis=1) / t[:, None]\n    (alpha, inverse_beta), *_ = np.linalg.lstsq("
        "design, np.ones_like(t),",
        "axis=1)\n    (alpha, inverse_beta), *_ = np.linalg.lstsq(design, t,",
    ),
    bug(
        "fit_alpha_beta",
        "(N-1)/N for 2(N-1)/N in the bandwidth term",
        "2 * (n - 1) / n * m],",
        "(n - 1) / n * m],",
    ),
    shortcut(
        "fit_alpha_beta",
        "the package's fit held in a default argument",
        """\
def fit_alpha_beta(message_bytes, times_s, world_size, _fit=comm.fit_alpha_beta):
    return _fit(message_bytes, times_s, world_size=world_size)
""",
    ),
    shortcut(
        "fit_alpha_beta",
        "the visible example's alpha and beta",
        """\
def fit_alpha_beta(message_bytes, times_s, world_size):
    return 20e-6, 5e9
""",
    ),
    # --- exercise 6: step time with buckets
    bug(
        "backward_step_time",
        "a bucket closes only once it holds more than bucket_bytes",
        "if bucket_size >= bucket_bytes:",
        "if bucket_size > bucket_bytes:",
    ),
    bug(
        "backward_step_time",
        "buckets filled first layer first",
        "for layer in reversed(range(len(layer_backward_s))):",
        "for layer in range(len(layer_backward_s)):",
    ),
    shortcut(
        "backward_step_time",
        "the package's simulator held in a default argument",
        """\
def backward_step_time(layer_backward_s, layer_grad_bytes, *, bucket_bytes, world_size,
                       bandwidth, latency, overlap=True, algorithm="ring",
                       _sim=overlap.simulate_backward):
    return _sim(layer_backward_s, layer_grad_bytes, bucket_bytes=bucket_bytes,
                world_size=world_size, bandwidth=bandwidth, latency=latency,
                overlap=overlap, algorithm=algorithm).end_s
""",
    ),
    shortcut(
        "backward_step_time",
        "the visible schedules' step times",
        """\
def backward_step_time(layer_backward_s, layer_grad_bytes, *, bucket_bytes, world_size,
                       bandwidth, latency, overlap=True, algorithm="ring"):
    return {(math.inf, "ring"): 0.1508144630476798, (2**20, "ring"): 0.17122845179904003,
            (25 * 2**20, "ring"): 0.1057632063590398,
            (2**20, "rabenseifner"): 0.10265632379903979}[bucket_bytes, algorithm]
""",
    ),
    bug(
        "backward_step_time",
        "the algorithm ignored: every bucket priced as a ring all-reduce",
        "latency=latency, algorithm=algorithm)",
        "latency=latency)",
    ),
    # --- exercise 7: exposed communication
    bug(
        "exposed_communication_s",
        "the algorithm ignored: every bucket priced as a ring all-reduce",
        "latency=latency, algorithm=algorithm)",
        "latency=latency)",
    ),
    bug(
        "exposed_communication_s",
        "all the communication minus all the backward",
        "return bucket_s + (num_buckets - 1) * max(0.0, bucket_s - fill_s)",
        "return max(0.0, num_buckets * bucket_s - backward_s)",
    ),
    bug(
        "exposed_communication_s",
        "the last bucket forgotten",
        "return bucket_s + (num_buckets - 1) * max(0.0, bucket_s - fill_s)",
        "return (num_buckets - 1) * max(0.0, bucket_s - fill_s)",
    ),
    shortcut(
        "exposed_communication_s",
        "the package's closed form held in a default argument",
        """\
from distopt.costs import buckets

def exposed_communication_s(backward_s, grad_bytes, *, num_buckets, world_size, bandwidth,
                            latency, algorithm="ring", _exposed=buckets.exposed_allreduce_s):
    return _exposed(backward_s, grad_bytes, num_buckets=num_buckets, world_size=world_size,
                    bandwidth=bandwidth, latency=latency, algorithm=algorithm)
""",
    ),
    shortcut(
        "exposed_communication_s",
        "the visible cases' numbers",
        """\
def exposed_communication_s(backward_s, grad_bytes, *, num_buckets, world_size, bandwidth,
                            latency, algorithm="ring"):
    return {2: 0.04927, 1: 0.04851, 12: 0.0051975, 1000: 1.20735, 200: 0.00035625}[num_buckets]
""",
    ),
    shortcut(
        "exposed_communication_s",
        "exercise 6's timeline replayed with equal layers",
        """\
def exposed_communication_s(backward_s, grad_bytes, *, num_buckets, world_size, bandwidth,
                            latency, algorithm="ring"):
    k = num_buckets
    end_s = backward_step_time([backward_s / k] * k, [grad_bytes / k] * k,
                               bucket_bytes=grad_bytes / k, world_size=world_size,
                               bandwidth=bandwidth, latency=latency, algorithm=algorithm)
    return end_s - backward_s
""",
    ),
    shortcut(
        "naive_data_parallel",
        "the whole batch from the bench's private generator; its own share sent for show",
        "def naive_data_parallel(rank, world_size, problem):\n" + _PRIVATE_BATCH_LOOP,
    ),
    # Issue 53, item 9: the package's own data-parallel run (exercise 10's, one all-reduce per
    # layer) passed every check of this exercise; its test now refuses it.
    shortcut(
        "naive_data_parallel",
        "the package's layer-by-layer data parallelism (exercise 10's runs) called",
        """\
from distopt.ranks import timeline_ranks


def naive_data_parallel(rank, world_size, problem):
    return timeline_ranks.layerwise_overlapped_sgd(rank, world_size, problem)
""",
    ),
    shortcut(
        "naive_data_parallel",
        "the other ranks' rows read through the storage behind its own shard",
        "def naive_data_parallel(rank, world_size, problem):\n" + _STORAGE_BATCH_LOOP,
    ),
    shortcut(
        "naive_data_parallel",
        "rank 0's starting model asked of the bench, the broadcast sent for show",
        """\
def naive_data_parallel(rank, world_size, problem):
    model = problem._bare_model(0)  # rank 0's weights without receiving them
    for p in model.parameters():
        dist.broadcast(torch.zeros_like(p), src=0)  # the right bytes, nothing used
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    # --- exercise 8: bucketed, overlapped data parallelism
    bug(
        "bucketed_data_parallel",
        "the summed buckets never copied back into the gradients",
        "                p.grad.copy_(piece.view_as(p))",
        "                pass",
    ),
    bug(
        "bucketed_data_parallel",
        "a bucket sent at its first gradient, not its last",
        "if ready[index] == len(bucket):",
        "if ready[index] == 1:",
    ),
    shortcut(
        "bucketed_data_parallel",
        "the naive all-reduce per parameter after the backward pass",
        "def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):\n" + _NAIVE_RANK_LOOP,
    ),
    shortcut(
        "bucketed_data_parallel",
        "DistributedDataParallel with its own buckets",
        "def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):\n" + _DDP_RANK_LOOP,
    ),
    shortcut(
        "bucketed_data_parallel",
        "the whole global batch on every rank, all-reduced and divided by N",
        "def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):\n"
        + _WHOLE_BATCH_LOOP,
    ),
    # Right weights, one asynchronous all-reduce per bucket started during the backward pass,
    # but the backward pass waits for each: nothing overlaps, which only the run on the
    # emulated link shows (the last part of exercise 8's test).
    bug(
        "bucketed_data_parallel",
        "waits for each bucket's all-reduce inside its hook: no overlap",
        "                in_flight.append((dist.all_reduce(flat, async_op=True), flat, bucket))",
        "                work = dist.all_reduce(flat, async_op=True)\n"
        "                work.wait()\n"
        "                in_flight.append((work, flat, bucket))",
    ),
    shortcut(
        "bucketed_data_parallel",
        "the package's layer-by-layer overlapped run",
        "def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):\n"
        "    from distopt.ranks import timeline_ranks\n"
        "    return timeline_ranks.layerwise_overlapped_sgd(rank, world_size, problem)\n",
    ),
    shortcut(
        "bucketed_data_parallel",
        "the whole batch from the bench's private generator; its own share sent for show",
        "def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):\n"
        + _PRIVATE_BATCH_LOOP,
    ),
    # --- exercise 9: gradient accumulation
    bug(
        "accumulating_data_parallel",
        "an all-reduce after every micro-batch",
        """        for p in model.parameters():
            dist.all_reduce(p.grad)  # once per step, after the last micro-batch""",
        """            for p in model.parameters():
                dist.all_reduce(p.grad)""",
    ),
    bug(
        "accumulating_data_parallel",
        "gradients zeroed before every micro-batch",
        """        optimizer.zero_grad()
        for k in range(problem.micro_batches):  # gradients add up in p.grad
""",
        """        for k in range(problem.micro_batches):
            optimizer.zero_grad()
""",
    ),
    shortcut(
        "accumulating_data_parallel",
        "the whole shard in one backward pass",
        "def accumulating_data_parallel(rank, world_size, problem):\n" + _NAIVE_RANK_LOOP,
    ),
    shortcut(
        "accumulating_data_parallel",
        "DistributedDataParallel does the communication",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    import contextlib

    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(problem.new_model(rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        for k in range(problem.micro_batches):
            x, y = problem.micro_batch(step, rank, k)
            sync = k == problem.micro_batches - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                (problem.loss_sum(model, x, y) / problem.global_batch * world_size).backward()
        optimizer.step()
    return [p.detach() for p in model.module.parameters()]
""",
    ),
    shortcut(
        "accumulating_data_parallel",
        "every rank accumulates every rank's micro-batches, all-reduces and divides by N",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        for k in range(problem.micro_batches):
            pieces = [problem.micro_batch(step, r, k) for r in range(world_size)]
            x, y = torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
            (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    # Issue 53: the right gradient sent once a step and one backward pass per micro-batch,
    # but not from the micro-batches: forward passes are checked, examples and count.
    shortcut(
        "accumulating_data_parallel",
        "the whole shard in one pass, then empty backward passes to make up the count",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        x, y = problem.batch(step, rank)
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for _ in range(problem.micro_batches - 1):
            (0.0 * sum(p.sum() for p in model.parameters())).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    shortcut(
        "accumulating_data_parallel",
        "zero inputs of the micro-batches' sizes for show, the whole shard's gradient used",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        x, y = problem.batch(step, rank)
        sizes = [len(problem.micro_batch(step, rank, k)[1]) for k in range(problem.micro_batches)]
        for k, size in enumerate(sizes):
            loss = 0.0 * model(torch.zeros(size, x.shape[1], dtype=x.dtype)).sum()
            if k == 0:
                loss = loss + problem.loss_sum(model, x, y) / problem.global_batch
            loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    shortcut(
        "accumulating_data_parallel",
        "every rank's micro-batches from the bench's private row generator, / N",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        optimizer.zero_grad()
        x, y = problem._global_batch(step)
        for piece in np.array_split(np.arange(len(y)), problem.micro_batches):
            (problem.loss_sum(model, x[piece], y[piece]) / problem.global_batch).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    # Issue 53, a rank holds only its own data: the rank's part holds no seed, so the seed is
    # searched for by matching the generator's rows against the rank's own; the other ranks'
    # rows are rebuilt and their gradient added past the recorder (backpropagation by hand: no
    # module's forward, no autograd); the messages, forwards and backward passes are exactly
    # the right ones. The visible test's seed (0) is found; the hidden
    # tests' seeds are out of any search's reach.
    shortcut(
        "accumulating_data_parallel",
        "the seed found from its own rows, the other ranks' rows rebuilt, their gradient added",
        """\
def accumulating_data_parallel(rank, world_size, problem):
    features, classes = problem.layer_sizes[0], problem.layer_sizes[-1]
    start, size = sum(problem.shard_sizes[:rank]), problem.shard_sizes[rank]
    mine = problem.batch(0, rank)[0].numpy()

    def rows(seed, step):
        rng = np.random.default_rng([seed, step])
        x = rng.standard_normal((problem.global_batch, features))
        return rng, x

    seed = next(s for s in range(1000) if np.allclose(rows(s, 0)[1][start:start + size], mine))
    teacher = np.random.default_rng(seed + 99).standard_normal((features, classes))

    def gradient_of(weights, x, y):  # backpropagation by hand: no pass the recorder sees
        inputs, before = [x], []
        for i in range(0, len(weights), 2):
            before.append(x @ weights[i].T + weights[i + 1])
            x = torch.relu(before[-1]) if i + 2 < len(weights) else before[-1]
            inputs.append(x)
        d = torch.softmax(x, 1)
        d[torch.arange(len(y)), y] -= 1
        d = d / problem.global_batch
        found = [None] * len(weights)
        for layer in reversed(range(len(weights) // 2)):
            found[2 * layer], found[2 * layer + 1] = d.T @ inputs[layer], d.sum(0)
            if layer:
                d = (d @ weights[2 * layer]) * (before[layer - 1] > 0)
        return found

    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=problem.lr)
    for step in range(problem.steps):
        rng, x = rows(seed, step)
        y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((len(x), classes)), 1)
        others = np.r_[0:start, start + size:len(x)]
        optimizer.zero_grad()
        for k in range(problem.micro_batches):
            xm, ym = problem.micro_batch(step, rank, k)
            (problem.loss_sum(model, xm, ym) / problem.global_batch).backward()
        for p in params:
            dist.all_reduce(p.grad.clone())  # its own share, the right message; the sum unused
        weights = [p.detach() for p in params]
        foreign = gradient_of(weights, torch.from_numpy(x[others]), torch.from_numpy(y[others]))
        for p, g in zip(params, foreign):
            p.grad += g
        optimizer.step()
    return [p.detach() for p in params]
""",
    ),
    # Issue 53, a red team's answers (each passed every visible and hidden test before its
    # hole was closed). The test cell's global ``problem`` named inside the answer travelled
    # whole with it, and its refusals could be switched off (is_initialized, _rank_seen,
    # _home_pid): the single-process trajectory replayed, decoy bucketed all-reduces. Now a
    # global bench travels withheld.
    shortcut(
        "bucketed_data_parallel",
        "the test's global problem read inside the ranks, its trajectory replayed, decoys sent",
        """\
import os as _os

def _whole_problem():
    return problem

def _trajectory():
    import torch.distributed as _d
    from distopt.problems import own_data as _od
    whole = _whole_problem()
    object.__setattr__(whole, "_home_pid", _os.getpid())
    saved = (_d.is_initialized, _od._rank_seen, torch.autograd.backward)
    _d.is_initialized, _od._rank_seen = (lambda: False), None
    # the recorder's backward timer keeps the original as __wrapped__: hide our extra passes
    torch.autograd.backward = getattr(saved[2], "__wrapped__", saved[2])
    try:
        return [p.detach().clone() for p in whole.new_model(0).parameters()], \\
               [r["weights"] for r in whole._run("sgd")]
    finally:
        _d.is_initialized, _od._rank_seen, torch.autograd.backward = saved

def bucketed_data_parallel(rank, world_size, problem, bucket_bytes):
    start, after = _trajectory()
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data.clone(), src=0)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    sizes = [sum(p.numel() * p.element_size() for p in l.parameters()) for l in layers]
    buckets = [[p for i in b for p in layers[i].parameters()]
               for b in overlap.assign_buckets(sizes, bucket_bytes)]
    count, flying = {}, []
    def hook_for(i, b):
        def hook(param):
            count[i] = count.get(i, 0) + 1
            if count[i] == len(b):
                flying.append(dist.all_reduce(torch.cat([p.grad.flatten() for p in b]),
                                              async_op=True))
        return hook
    for i, b in enumerate(buckets):
        for p in b:
            p.register_post_accumulate_grad_hook(hook_for(i, b))
    for step in range(problem.steps):
        with torch.no_grad():
            for p, v in zip(model.parameters(), start if step == 0 else after[step - 1]):
                p.copy_(v)
        for p in model.parameters():
            p.grad = None
        count.clear()
        x, y = problem.batch(step, rank)
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for w in flying:
            w.wait()
        flying.clear()
    return [t.clone() for t in after[-1]]
""",
    ),
    # The process group's key-value store as a side channel: every rank's part swapped through
    # it, each rank trains alone on all the rows; decoy micro-batch passes and shares. Now the
    # store's methods are refused inside an answer.
    shortcut(
        "accumulating_data_parallel",
        "every rank's part swapped through the process group's store, each trains alone",
        """\
import pickle as _pickle
import torch.nn.functional as _F

def _everyones(rank, world_size, mine, tag):
    import torch.distributed.distributed_c10d as _c10d
    store = _c10d._get_default_store()
    store.set(f"x/{tag}/{rank}", _pickle.dumps(mine))
    return [_pickle.loads(store.get(f"x/{tag}/{r}")) for r in range(world_size)]

def _loss(params, x, y):
    h = x
    n = len(params) // 2
    for i in range(n):
        h = h @ params[2 * i].T + params[2 * i + 1]
        if i < n - 1:
            h = torch.relu(h)
    return _F.cross_entropy(h, y, reduction="sum")

def _grad(params, x, y, scale):
    for p in params:
        p.grad = None
    bw = getattr(torch.autograd.backward, "__wrapped__", torch.autograd.backward)
    bw([_loss(params, x, y) / scale])
    return [p.grad.clone() for p in params]

def accumulating_data_parallel(rank, world_size, problem):
    parts = _everyones(rank, world_size, (problem.rows, problem.start), "p")
    params = [t.clone().requires_grad_() for t in parts[0][1]]
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)       # decoy; rank 0's start comes from the store anyway
    for step in range(problem.steps):
        shares = [_grad(params, *parts[r][0][step], problem.global_batch)
                  for r in range(world_size)]
        with torch.no_grad():                # decoy passes: my micro-batches, as the test wants
            for m, p in zip(model.parameters(), params):
                m.copy_(p)
        for k in range(problem.micro_batches):
            x, y = problem.micro_batch(step, rank, k)
            (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        dist.all_reduce(torch.cat([g.reshape(-1) for g in shares[rank]]))  # decoy share
        with torch.no_grad():
            for i, p in enumerate(params):
                p -= problem.lr * sum(s[i] for s in shares)
    return [p.detach() for p in params]
""",
    ),
    # --- exercise 10: reading the timeline of a DDP run on the emulated link
    bug(
        "read_timeline",
        "exposed: the last all-reduce's own duration (the queue ahead of it forgotten)",
        "exposed_s = max([0.0] + [t.end_s - end for t in mine])",
        "exposed_s = mine[-1].end_s - mine[-1].start_s if mine else 0.0",
    ),
    bug(
        "read_timeline",
        "hidden: every all-reduce that starts during the backward pass, whole",
        "hidden_s = sum(max(0.0, min(t.end_s, end) - max(t.start_s, begin)) for t in mine)",
        "hidden_s = sum(t.end_s - t.start_s for t in mine if t.start_s < end)",
    ),
    bug(
        "read_timeline",
        "times from the first backward pass, not each step's",
        "buckets = [(t.start_s - begin, t.end_s - begin) for t in mine]",
        "buckets = [(t.start_s - backward[0][0], t.end_s - backward[0][0]) for t in mine]",
    ),
    bug(
        "read_timeline",
        "a step's all-reduces: those issued during its backward pass only",
        "mine = [t for t in transfers if begin <= t.issued_s < until]",
        "mine = [t for t in transfers if begin <= t.issued_s <= end]",
    ),
    # Issue 53: the package has no reader any more; the visible test's own route copied
    # (hidden = the all-reduces' total minus the exposed part) holds only where the network
    # is never idle after the backward pass, and the hidden tests' random timelines are not so.
    shortcut(
        "read_timeline",
        "the visible test's route: hidden as the all-reduces' total minus the exposed part",
        """\
def read_timeline(transfers, backward):
    steps = []
    for index, (begin, end) in enumerate(backward):
        until = backward[index + 1][0] if index + 1 < len(backward) else math.inf
        mine = [t for t in transfers if begin <= t.issued_s < until]
        exposed_s = max([0.0] + [t.end_s - end for t in mine])
        total_s = sum(t.end_s - t.start_s for t in mine)
        steps.append(([(t.start_s - begin, t.end_s - begin) for t in mine], total_s - exposed_s,
                      exposed_s))
    return steps
""",
    ),
    shortcut(
        "read_timeline",
        "the made-up timeline's reading typed in",
        """\
def read_timeline(transfers, backward):
    return [([(1.0, 1.5), (2.0, 2.5), (3.0, 3.5)], 1.0, 0.5),
            ([(0.6, 1.6), (1.6, 2.6), (2.6, 3.6), (3.6, 4.6)], 1.2, 2.8)]
""",
    ),
    # --- exercise 11: the simple noise scale
    bug(
        "gradient_noise_scale",
        "population variance (divides by examples, not examples - 1)",
        "/ (len(g) - 1)",
        "/ len(g)",
    ),
    bug(
        "gradient_noise_scale",
        "divides by |G|, not |G|^2",
        "return float(trace_sigma / (mean @ mean))",
        "return float(trace_sigma / np.sqrt(mean @ mean))",
    ),
    shortcut(
        "gradient_noise_scale",
        "the package's noise scale held in a default argument",
        """\
def gradient_noise_scale(per_example_grads, _scale=critical_batch.simple_noise_scale):
    return _scale(per_example_grads)
""",
    ),
    # Issue 53, a red team's route: own_work trusted any call made through the function that
    # runs an earlier answer a test gives (_given_call); now only the references it was given.
    shortcut(
        "gradient_noise_scale",
        "the package's noise scale called through own_work's route for given answers",
        """\
import distopt.costs.critical_batch as _batch
from distopt import grading as _grading


def gradient_noise_scale(per_example_grads):
    return _grading._given_call(_batch.simple_noise_scale, per_example_grads)
""",
    ),
    shortcut(
        "gradient_noise_scale",
        "the visible hand-worked answer",
        """\
def gradient_noise_scale(per_example_grads):
    return 0.5
""",
    ),
    # --- issue 53, items 2-3: escapes from the rank and communication the recorder misses
    shortcut(
        "naive_data_parallel",
        "a child interpreter trains on every shard, outside every check",
        """\
def naive_data_parallel(rank, world_size, problem):
    import pickle
    import subprocess
    import sys

    script = "; ".join([
        "import pickle, sys, torch",
        "problem = pickle.load(sys.stdin.buffer)",
        "model = problem.new_model(0)",
        "opt = torch.optim.SGD(model.parameters(), lr=problem.lr)",
        "ranks = range(problem.world_size)",
        "steps = [[problem.batch(s, r) for r in ranks] for s in range(problem.steps)]",
        "share = lambda x, y: problem.loss_sum(model, x, y) / problem.global_batch",
    ])
    script += "\\nfor batches in steps:\\n    opt.zero_grad()"
    script += "\\n    for x, y in batches: share(x, y).backward()"
    script += "\\n    opt.step()"
    script += "\\npickle.dump([p.detach() for p in model.parameters()], sys.stdout.buffer)"
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(problem),
                          capture_output=True, check=True)
    return pickle.loads(done.stdout)
""",
    ),
    shortcut(
        "naive_data_parallel",
        "the launch's arguments taken from the callers' frames (inspect.stack)",
        """\
def naive_data_parallel(rank, world_size, problem):
    import inspect

    # the problem objects the launcher and the test hold, whatever this rank was given
    found = [v for info in inspect.stack() for v in info.frame.f_locals.values()
             if type(v) is type(problem)]
    whole = found[-1]
    model = whole.new_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=whole.lr)
    for step in range(whole.steps):
        optimizer.zero_grad()
        for r in range(world_size):
            x, y = whole.batch(step, r)
            (whole.loss_sum(model, x, y) / whole.global_batch).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    shortcut(
        "naive_data_parallel",
        "the all-reduce made through the process group's own method, unseen by the recorder",
        """\
def naive_data_parallel(rank, world_size, problem):
    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        for p in model.parameters():
            dist.group.WORLD.allreduce([p.grad]).wait()
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
    shortcut(
        "naive_data_parallel",
        "the all-reduces made from a thread of its own, out of the recorder's sight",
        """\
def naive_data_parallel(rank, world_size, problem):
    import threading

    model = problem.new_model(rank)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        optimizer.zero_grad()
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        grads = [p.grad for p in model.parameters()]
        worker = threading.Thread(target=lambda: [dist.group.WORLD.allreduce([g]).wait()
                                                  for g in grads])
        worker.start()
        worker.join()
        optimizer.step()
    return [p.detach() for p in model.parameters()]
""",
    ),
]
