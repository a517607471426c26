"""Mutants of section 03 (model parallelism): see tests/grader/mutants/__init__.py."""

import dataclasses

from distopt.costs import planner
from distopt.units import GB, H100_MEMORY_BYTES, gbit_per_s
from tests.grader.mutants import bug, shortcut

# --- the visible tests' answers, as a student who copies them would type them -------------

_H100 = dict(gpus_per_server=8, memory_bytes=H100_MEMORY_BYTES, intra_bandwidth=450 * GB,
             inter_bandwidth=gbit_per_s(400), flops_per_s=400e12)  # fmt: skip
_CLUSTER = planner.ClusterSpec(64, **_H100)
_MODEL_1B = planner.ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048)
_GPT3 = planner.ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048)


def _typed(layout) -> str:
    return "None" if layout is None else f"planner.{layout!r}"


def _choice(model, batch, candidates):
    """choose_layout's answer by the rule, from the package's cost model."""
    rows = []
    for layout in candidates:
        peak = sum(planner.memory_per_gpu(model, layout, batch).values())
        if peak <= planner.USABLE_FRACTION * _CLUSTER.memory_bytes:
            seconds = sum(planner.step_time_breakdown(model, _CLUSTER, layout, batch).values())
            sent = sum(planner.traffic_bytes(model, layout, batch).values())
            rows.append((planner.rank_key(seconds, sent, peak), layout))
    rows.sort(key=lambda row: row[0])
    if not rows:
        return "(None, None, None)"
    if len(rows) == 1:
        return f"({_typed(rows[0][1])}, 'fits', None)"
    (best, layout), (second, _) = rows[0], rows[1]
    for name, mine, theirs in zip(("time", "traffic", "memory"), best, second, strict=True):
        if theirs != mine:
            return f"({_typed(layout)}, {name!r}, {theirs - mine!r})"
    return f"({_typed(layout)}, None, None)"


_ZERO_B4 = [planner.Layout(1, 1, 64, stage, 4, False) for stage in (3, 0, 2, 1)]
_CHOICES_SEEN = [
    (_MODEL_1B, 512, _ZERO_B4),
    (_MODEL_1B, 512, [_ZERO_B4[2], _ZERO_B4[3]]),
    (_GPT3, 64, [planner.Layout(8, 8, 1, 0, 1, False), planner.Layout(8, 4, 2, 1, 1, False)]),
    (_GPT3, 64, [planner.Layout(8, 1, 8, 3, 4, False), planner.Layout(8, 4, 2, 1, 1, False)]),
    (_GPT3, 64, [planner.Layout(1, 1, 64, stage, 1, False) for stage in (0, 1)]),
]
_CHOICES_TYPED = ", ".join(
    f"({', '.join(_typed(layout) for layout in candidates)},): {_choice(model, batch, candidates)}"
    for model, batch, candidates in _CHOICES_SEEN
)


def _deadline(model, cluster, batch, tokens, days, max_servers):
    """servers_for_deadline's answer, typed."""
    for servers in range(1, max_servers + 1):
        sized = dataclasses.replace(cluster, num_gpus=servers * cluster.gpus_per_server)
        ranked = planner.plan(model, sized, batch, tensor_in_server=True)
        if ranked:
            layout, _, seconds = ranked[0]
            needed = tokens / (batch * model.seq_len) * seconds / 86400
            if needed <= days:
                used = planner.mfu(model, sized, batch, seconds)
                return f"({servers}, {_typed(layout)}, {needed!r}, {used!r})"
    return "None"


_FOUR = planner.ClusterSpec(4, **{**_H100, "gpus_per_server": 4})
_EIGHT = planner.ClusterSpec(8, **_H100)
_DEADLINES_TYPED = ", ".join(
    f"({limit}, {batch}, {cluster.gpus_per_server}): "
    f"{_deadline(model, cluster, batch, tokens, days, limit)}"
    for model, cluster, batch, tokens, days, limit in [
        (_GPT3, _EIGHT, 1536, 300e9, 30, 48),
        (_GPT3, _EIGHT, 1536, 300e9, 30, 40),
        (_MODEL_1B, _EIGHT, 512, 26e9, 0.25, 16),
        (_GPT3, _FOUR, 64, 50e9, 60, 16),
    ]
)

VARIANTS = [
    # --- exercise 1: Megatron's f and g ----------------------------------------------------------
    bug(
        "megatron_mlp_rank",
        "f's backward forgets the sum over the ranks",
        "        dist.all_reduce(grad)\n",
        "",
    ),
    bug(
        "megatron_mlp_rank",
        "b_out added on every rank before g",
        'y = ReduceFromTensorParallel.apply(hidden @ params["w_out"]) + params["b_out"]',
        'y = ReduceFromTensorParallel.apply(hidden @ params["w_out"] + params["b_out"])',
    ),
    shortcut(
        "megatron_mlp_rank",
        "no messages: f and g left as identities",
        """\
class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTensorParallel(CopyToTensorParallel):
    pass


def megatron_mlp_rank(rank, world_size, shard):
    params = {name: getattr(shard, name).clone().requires_grad_()
              for name in ("w_in", "b_in", "w_out", "b_out")}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(x @ params["w_in"] + params["b_in"])
    y = hidden @ params["w_out"] + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad
""",
    ),
    shortcut(
        "megatron_mlp_rank",
        "all-gather the weights, run the whole block on every rank",
        """\
def megatron_mlp_rank(rank, world_size, shard):
    def gather(part, dim):
        parts = [torch.empty_like(part) for _ in range(world_size)]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts, dim=dim).requires_grad_()

    w_in, b_in, w_out = gather(shard.w_in, 1), gather(shard.b_in, 0), gather(shard.w_out, 0)
    b_out = shard.b_out.clone().requires_grad_()
    x = shard.x.clone().requires_grad_()
    y = F.gelu(x @ w_in + b_in) @ w_out + b_out
    y.backward(shard.grad_output)
    cols = shard.w_in.shape[1]
    mine = slice(rank * cols, (rank + 1) * cols)
    grads = {"w_in": w_in.grad[:, mine], "b_in": b_in.grad[mine], "w_out": w_out.grad[mine],
             "b_out": b_out.grad}
    return y.detach(), grads, x.grad
""",
    ),
    shortcut(
        "megatron_mlp_rank",
        "decoy payloads: offsets that cancel over the ranks in both all-reduces",
        """\
class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        rank, n = dist.get_rank(), dist.get_world_size()
        grad = grad + (1.0 if rank == 0 else -1.0 if rank == 1 else 0.0) * (n > 1)
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        rank, n = dist.get_rank(), dist.get_world_size()
        total = partial + (1.0 if rank == 0 else -1.0 if rank == 1 else 0.0) * (n > 1)
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def megatron_mlp_rank(rank, world_size, shard):
    params = {name: getattr(shard, name).clone().requires_grad_()
              for name in ("w_in", "b_in", "w_out", "b_out")}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(CopyToTensorParallel.apply(x) @ params["w_in"] + params["b_in"])
    y = ReduceFromTensorParallel.apply(hidden @ params["w_out"]) + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad
""",
    ),
    shortcut(
        "megatron_mlp_rank",
        "the bench rebuilt in the rank from a guessed seed",
        """\
from distopt.problems.megatron_mlp import MegatronMLP


class CopyToTensorParallel(torch.autograd.Function):
    pass


class ReduceFromTensorParallel(torch.autograd.Function):
    pass


def megatron_mlp_rank(rank, world_size, shard):
    hidden, tokens = shard.x.shape[1], shard.x.shape[0]
    for seed in range(100):
        bench = MegatronMLP(hidden=hidden, tokens=tokens, world_size=world_size, seed=seed)
        if torch.equal(bench.inputs()[0], shard.x):
            break
    whole = bench.reference()
    grads = {name: bench.split(name, whole.grads[name], rank)
             for name in ("w_in", "b_in", "w_out", "b_out")}
    dist.all_reduce(torch.zeros_like(shard.x))  # the all-reduces the test counts, for show
    y = torch.zeros_like(shard.x, requires_grad=True)
    y.sum().backward()
    return whole.output, grads, whole.input_grad
""",
    ),
    # --- exercise 2: the tensor-parallel degree --------------------------------------------------
    bug(
        "best_tensor_degree",
        "an all-reduce sends (t-1)/t, not 2(t-1)/t",
        "sent = 4 * 2 * (t - 1) / t",
        "sent = 4 * (t - 1) / t",
    ),
    bug(
        "best_tensor_degree",
        "every group on the intra-server link",
        "bandwidth = intra_bandwidth if t <= gpus_per_server else inter_bandwidth",
        "bandwidth = intra_bandwidth",
    ),
    bug(
        "best_tensor_degree",
        "memory ignored: every divisor of the heads allowed",
        "if heads % t or state_bytes / t > memory_bytes:",
        "if heads % t:",
    ),
    bug(
        "best_tensor_degree",
        "one layer's latency as the objective, as if GPUs were free",
        "if efficiency > best_efficiency:",
        "if best_t is None or compute + sent / bandwidth < best_seconds:\n"
        "            best_seconds = compute + sent / bandwidth",
    ),
    shortcut(
        "best_tensor_degree",
        "the package's fastest degree (one layer's latency) held in a default argument",
        """\
from distopt.costs import tensor_layer


def best_tensor_degree(tokens, hidden, heads, *, state_bytes, memory_bytes, flops_per_s,
                       intra_bandwidth, inter_bandwidth, gpus_per_server, max_degree,
                       bytes_per_value=2, _fastest=tensor_layer.fastest_degree,
                       _efficiency=tensor_layer.layer_efficiency):
    t, _ = _fastest(tokens, hidden, heads, flops_per_s=flops_per_s,
                    intra_bandwidth=intra_bandwidth, inter_bandwidth=inter_bandwidth,
                    gpus_per_server=gpus_per_server, max_degree=max_degree,
                    bytes_per_value=bytes_per_value)
    if state_bytes / t > memory_bytes:
        return None, 0.0
    link = intra_bandwidth if t <= gpus_per_server else inter_bandwidth
    return t, _efficiency(tokens, hidden, t, flops_per_s=flops_per_s, bandwidth=link,
                          bytes_per_value=bytes_per_value)
""",
    ),
    shortcut(
        "best_tensor_degree",
        "the smallest degree that fits, whatever the links (the visible test's rule)",
        """\
def best_tensor_degree(tokens, hidden, heads, *, state_bytes, memory_bytes, flops_per_s,
                       intra_bandwidth, inter_bandwidth, gpus_per_server, max_degree,
                       bytes_per_value=2):
    for t in range(1, max_degree + 1):
        if heads % t == 0 and state_bytes / t <= memory_bytes:
            compute = 72 * tokens * hidden**2 / (t * flops_per_s)
            bandwidth = intra_bandwidth if t <= gpus_per_server else inter_bandwidth
            sent = 8 * (t - 1) / t * tokens * hidden * bytes_per_value
            return t, compute / (compute + sent / bandwidth)
    return None, 0.0
""",
    ),
    shortcut(
        "best_tensor_degree",
        "the visible cases' answers",
        """\
def best_tensor_degree(tokens, hidden, heads, *, state_bytes, memory_bytes, flops_per_s,
                       intra_bandwidth, inter_bandwidth, gpus_per_server, max_degree,
                       bytes_per_value=2):
    return {1024: (1, 1.0), 8192: (4, 0.9325418240690772), 32768: (16, 0.5513280689160086),
            65536: (None, 0.0), 1536: (6, 0.43744374437443745)}[hidden]
""",
    ),
    # --- exercise 3: the bubble ------------------------------------------------------------------
    bug(
        "bubble_fraction_formula",
        "interleaving forgotten",
        "idle = (stages - 1) / interleave",
        "idle = stages - 1",
    ),
    bug(
        "bubble_fraction_formula",
        "idle over the ideal time (the overhead), not over the total",
        "return idle / (micro_batches + idle)",
        "return idle / micro_batches",
    ),
    shortcut(
        "bubble_fraction_formula",
        "the package's answer held in a default argument",
        """\
def bubble_fraction_formula(stages, micro_batches, interleave=1, _answer=bubbles.bubble_fraction):
    return _answer(stages, micro_batches, interleave)
""",
    ),
    shortcut(
        "bubble_fraction_formula",
        "the visible cases' fractions",
        """\
def bubble_fraction_formula(stages, micro_batches, interleave=1):
    return {(1, 4): 0.0, (2, 3): 1 / 4, (4, 8): 3 / 11, (8, 32): 7 / 39}[stages, micro_batches]
""",
    ),
    # --- exercise 4: micro-batches in flight -----------------------------------------------------
    bug(
        "max_in_flight_formula",
        "1F1B's extra forward before the first backward forgotten",
        "return min(stages - stage, micro_batches)",
        "return min(stages - stage - 1, micro_batches)",
    ),
    bug(
        "max_in_flight_formula",
        "1F1B not capped by the number of micro-batches",
        "return min(stages - stage, micro_batches)",
        "return stages - stage",
    ),
    shortcut(
        "max_in_flight_formula",
        "the simulator's count held in default arguments",
        """\
def max_in_flight_formula(schedule, stages, micro_batches, stage, _simulate=pipeline.simulate,
                          _count=pipeline.max_in_flight):
    return _count(_simulate(schedule, stages, micro_batches), stage)
""",
    ),
    shortcut(
        "max_in_flight_formula",
        "the visible cases' counts",
        """\
def max_in_flight_formula(schedule, stages, micro_batches, stage):
    return 8 if schedule == "gpipe" else [4, 3, 2, 1][stage]
""",
    ),
    # --- exercise 5: GPipe over messages ---------------------------------------------------------
    bug(
        "gpipe_stage",
        "the loss not divided by the batch size",
        "out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size",
        "out = stage.loss_sum(out, stage.targets[k])",
    ),
    bug(
        "gpipe_stage",
        "the stage's input passed on, not its output",
        "sends.append(dist.isend(out.detach(), dst=rank + 1))",
        "sends.append(dist.isend(x.detach(), dst=rank + 1))",
    ),
    shortcut(
        "gpipe_stage",
        "the whole batch in one message each way (no micro-batches)",
        """\
def gpipe_stage(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    m, b, w = stage.micro_batches, stage.micro_batch, stage.width
    if first:
        x = torch.cat(list(stage.inputs))
    else:
        x = torch.empty((m * b, w), dtype=torch.float64)
        dist.recv(x, src=rank - 1)
        x.requires_grad_()
    out = stage.model(x)
    if last:
        out = sum(stage.loss_sum(o, t) for o, t in zip(out.split(b), stage.targets))
        out = out / stage.batch_size
    grad = None
    if not last:
        dist.send(out.detach(), dst=rank + 1)
        grad = torch.empty((m * b, w), dtype=torch.float64)
        dist.recv(grad, src=rank + 1)
    out.backward(grad)
    if not first:
        dist.send(x.grad, dst=rank - 1)
    return [p.grad for p in stage.model.parameters()]
""",
    ),
    shortcut(
        "gpipe_stage",
        "all-reduces in place of point-to-point messages",
        """\
def gpipe_stage(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    shape = (stage.micro_batch, stage.width)
    inputs, outputs = [], []
    for k in range(stage.micro_batches):
        x = stage.inputs[k] if first else None
        for boundary in range(world_size):
            if boundary == rank:
                out = stage.model(x)
                if last:
                    out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size
                inputs.append(x)
                outputs.append(out)
            if boundary < world_size - 1:  # everyone joins: the sender's output, zeros elsewhere
                buf = out.detach().clone() if boundary == rank else torch.zeros(shape,
                                                                                 dtype=torch.float64)
                dist.all_reduce(buf)
                if boundary + 1 == rank:
                    x = buf.requires_grad_()
    for k in range(stage.micro_batches):
        grad = None
        for boundary in reversed(range(world_size)):
            if boundary == rank:
                outputs[k].backward(grad)
            if boundary > 0:
                buf = inputs[k].grad.clone() if boundary == rank else torch.zeros(
                    shape, dtype=torch.float64)
                dist.all_reduce(buf)
                if boundary - 1 == rank:
                    grad = buf
    return [p.grad for p in stage.model.parameters()]
""",
    ),
    shortcut(
        "gpipe_stage",
        "the whole batch in one forward per stage, sent as m micro-batch messages",
        """\
def gpipe_stage(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    m, b, w = stage.micro_batches, stage.micro_batch, stage.width
    if first:
        x = torch.cat(list(stage.inputs))
    else:
        x = torch.empty((m * b, w), dtype=torch.float64)
        for k in range(m):
            part = torch.empty((b, w), dtype=torch.float64)
            dist.recv(part, src=rank - 1)
            x[k * b:(k + 1) * b] = part
        x.requires_grad_()
    out = stage.model(x)  # one forward: the messages look like GPipe's, the step does not
    if last:
        out = sum(stage.loss_sum(o, t) for o, t in zip(out.split(b), stage.targets)) / (m * b)
    else:
        for part in out.detach().split(b):
            dist.send(part.contiguous(), dst=rank + 1)
    grad = None
    if not last:
        grad = torch.empty((m * b, w), dtype=torch.float64)
        for k in range(m):
            part = torch.empty((b, w), dtype=torch.float64)
            dist.recv(part, src=rank + 1)
            grad[k * b:(k + 1) * b] = part
    out.backward(grad)
    if not first:
        for part in x.grad.split(b):
            dist.send(part.contiguous(), dst=rank - 1)
    return [p.grad for p in stage.model.parameters()]
""",
    ),
    shortcut(
        "gpipe_stage",
        "decoy messages: each gradient sent doubled and halved on receipt",
        """\
def gpipe_stage(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    shape = (stage.micro_batch, stage.width)
    inputs, outputs, sends = [], [], []
    for k in range(stage.micro_batches):
        if first:
            x = stage.inputs[k]
        else:
            x = torch.empty(shape, dtype=torch.float64)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage.model(x)
        if last:
            out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs.append(x)
        outputs.append(out)
    for k in range(stage.micro_batches):
        grad = None
        if not last:
            grad = torch.empty(shape, dtype=torch.float64)
            dist.recv(grad, src=rank + 1)
            grad = grad / 2  # the sender doubled it: the values come out right
        outputs[k].backward(grad)
        if not first:
            sends.append(dist.isend(2 * inputs[k].grad, dst=rank - 1))
    for work in sends:
        work.wait()
    return [p.grad for p in stage.model.parameters()]
""",
    ),
    shortcut(
        "gpipe_stage",
        "the micro-batches' forwards in reverse order, the sums unchanged",
        """\
def gpipe_stage(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    shape = (stage.micro_batch, stage.width)
    m = stage.micro_batches
    inputs, outputs, sends = {}, {}, []
    for k in reversed(range(m)):
        if first:
            x = stage.inputs[k]
        else:
            x = torch.empty(shape, dtype=torch.float64)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage.model(x)
        if last:
            out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs[k], outputs[k] = x, out
    for k in reversed(range(m)):
        grad = None
        if not last:
            grad = torch.empty(shape, dtype=torch.float64)
            dist.recv(grad, src=rank + 1)
        outputs[k].backward(grad)
        if not first:
            sends.append(dist.isend(inputs[k].grad, dst=rank - 1))
    for work in sends:
        work.wait()
    return [p.grad for p in stage.model.parameters()]
""",
    ),
    shortcut(
        "gpipe_stage",
        "the whole model rebuilt in the rank from a bench with a guessed seed",
        """\
from distopt.problems.pipeline_stack import PipelineStack


def gpipe_stage(rank, world_size, stage):
    layers = len(stage.model) // 2
    for seed in range(100):
        bench = PipelineStack(stages=world_size, micro_batches=stage.micro_batches,
                              micro_batch=stage.micro_batch, width=stage.width,
                              layers_per_stage=layers, seed=seed)
        mine = bench.stage(rank).model
        if all(torch.equal(a, b) for a, b in zip(mine.parameters(), stage.model.parameters())):
            break
    return bench.reference_grads()[rank]
""",
    ),
    # --- exercise 6: all-to-all counts -----------------------------------------------------------
    bug(
        "all_to_all_counts",
        "experts dealt round-robin to devices",
        "counts[source, expert // experts_per_device] += 1",
        "counts[source, expert % world_size] += 1",
    ),
    bug(
        "all_to_all_counts",
        "sender and receiver swapped",
        "counts[source, expert // experts_per_device] += 1",
        "counts[expert // experts_per_device, source] += 1",
    ),
    shortcut(
        "all_to_all_counts",
        "the package's answer held in a default argument",
        """\
def all_to_all_counts(chosen_experts, token_device, num_experts, world_size,
                      _answer=experts.dispatch_counts):
    return _answer(chosen_experts, token_device, num_experts, world_size)
""",
    ),
    shortcut(
        "all_to_all_counts",
        "the visible cases' matrices",
        """\
def all_to_all_counts(chosen_experts, token_device, num_experts, world_size):
    if len(token_device) == 2:
        return np.array([[1, 1], [1, 1]])
    return np.array([[130, 127, 127, 128], [120, 136, 145, 111], [129, 121, 136, 126],
                     [127, 131, 135, 119]])
""",
    ),
    # --- exercise 7: dropped copies --------------------------------------------------------------
    bug(
        "dropped_copies_at",
        "capacity not rounded before the ceiling",
        "math.ceil(round(capacity_factor * tokens * k / num_experts, 9))",
        "math.ceil(capacity_factor * tokens * k / num_experts)",
    ),
    bug(
        "dropped_copies_at",
        "capacity counted in tokens, not token copies",
        "round(capacity_factor * tokens * k / num_experts, 9)",
        "round(capacity_factor * tokens / num_experts, 9)",
    ),
    shortcut(
        "dropped_copies_at",
        "the package's answer held in a default argument",
        """\
def dropped_copies_at(chosen_experts, num_experts, capacity_factor,
                      _answer=experts.dropped_copies):
    return _answer(chosen_experts, num_experts, capacity_factor)
""",
    ),
    shortcut(
        "dropped_copies_at",
        "the visible cases' counts",
        """\
def dropped_copies_at(chosen_experts, num_experts, capacity_factor):
    return {(4, 1.0): 1, (4, 2.0): 0, (200, 1.1): 1, (1024, 1.0): 39}[
        len(chosen_experts), capacity_factor]
""",
    ),
    # --- exercise 8: the load-balancing loss -----------------------------------------------------
    bug(
        "load_balancing_loss",
        "f over the tokens, not the token copies",
        "/ (tokens * k)",
        "/ tokens",
    ),
    bug(
        "load_balancing_loss",
        "the factor E forgotten",
        "return float(num_experts * np.sum(fraction * probs.mean(axis=0)))",
        "return float(np.sum(fraction * probs.mean(axis=0)))",
    ),
    shortcut(
        "load_balancing_loss",
        "the package's answer held in a default argument",
        """\
def load_balancing_loss(logits, chosen_experts, num_experts,
                        _answer=experts.load_balancing_loss):
    return _answer(logits, chosen_experts, num_experts)
""",
    ),
    shortcut(
        "load_balancing_loss",
        "the softmax without its maximum subtracted",
        """\
def load_balancing_loss(logits, chosen_experts, num_experts):
    tokens, k = chosen_experts.shape
    fraction = np.bincount(chosen_experts.ravel(), minlength=num_experts) / (tokens * k)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return float(num_experts * np.sum(fraction * probs.mean(axis=0)))
""",
    ),
    # --- exercise 9: expert parallelism on ranks -------------------------------------------------
    bug(
        "expert_parallel_moe",
        "dropped copies kept: no capacity",
        "kept = queue[: shard.capacity]",
        "kept = queue",
    ),
    bug(
        "expert_parallel_moe",
        "the returned rows added in token order, not in the order they were sent",
        "y = x.index_add(0, token, gates.flatten()[order, None] * returned)",
        "y = x.index_add(0, torch.arange(len(order)) // k, gates.flatten()[:, None] * returned)",
    ),
    bug(
        "expert_parallel_moe",
        "AllToAll's backward with the forward's split sizes",
        """\
        back = grad.new_empty((sum(ctx.send_counts), grad.shape[1]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send_counts,
                               input_split_sizes=ctx.recv_counts)  # the exchange reversed
""",
        """\
        back = grad.new_empty((sum(ctx.recv_counts), grad.shape[1]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.recv_counts,
                               input_split_sizes=ctx.send_counts)
""",
    ),
    shortcut(
        "expert_parallel_moe",
        "all-gather the tokens, all-reduce the results: no all-to-all",
        """\
import torch.distributed.nn.functional as differentiable


class AllToAll(torch.autograd.Function):
    pass


def expert_parallel_moe(rank, world_size, shard):
    x = shard.x.clone().requires_grad_()
    everyone = torch.cat(differentiable.all_gather(x))  # every rank's tokens, rank 0's first
    probs = torch.softmax(shard.router(everyone), dim=1)
    gates, chosen = probs.topk(shard.top_k, dim=1)
    mine = torch.zeros_like(everyone)
    for j, expert in enumerate(shard.experts):
        tokens, slot = torch.nonzero(chosen == shard.first_expert + j, as_tuple=True)
        tokens, slot = tokens[: shard.capacity], slot[: shard.capacity]
        mine = mine.index_add(0, tokens, gates[tokens, slot, None] * expert(everyone[tokens]))
    total = differentiable.all_reduce(mine)
    rows = slice(rank * len(x), (rank + 1) * len(x))
    y = x + total[rows]
    y.backward(shard.grad_output)
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]
""",
    ),
    shortcut(
        "expert_parallel_moe",
        "split sizes not exchanged: each rank expects as many rows back as it sends",
        """\
class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts):
        ctx.send_counts, ctx.recv_counts = send_counts, recv_counts
        received = rows.new_empty((sum(recv_counts), rows.shape[1]))
        dist.all_to_all_single(received, rows.contiguous(), output_split_sizes=recv_counts,
                               input_split_sizes=send_counts)
        return received

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty((sum(ctx.send_counts), grad.shape[1]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send_counts,
                               input_split_sizes=ctx.recv_counts)
        return back, None, None


def expert_parallel_moe(rank, world_size, shard):
    num_experts, k = shard.num_experts, shard.top_k
    local = num_experts // world_size
    x = shard.x.clone().requires_grad_()
    probs = torch.softmax(shard.router(x), dim=1)
    gates, chosen = probs.topk(k, dim=1)
    order = torch.argsort(chosen.flatten(), stable=True)
    token = order // k
    per_expert = torch.bincount(chosen.flatten(), minlength=num_experts)
    counts = per_expert.view(world_size, local).sum(dim=1).tolist()
    received = AllToAll.apply(x[token], counts, counts)
    results = torch.zeros_like(received)
    start = 0
    for j, expert in enumerate(shard.experts):
        n = int(per_expert[shard.first_expert + j])
        kept = torch.arange(start, start + min(n, shard.capacity))
        results = results.index_put((kept,), expert(received[kept]))
        start += n
    returned = AllToAll.apply(results, counts, counts)
    y = x.index_add(0, token, gates.flatten()[order, None] * returned)
    y.backward(shard.grad_output)
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]
""",
    ),
    shortcut(
        "expert_parallel_moe",
        "decoy backward all-to-alls: each gradient sent doubled and halved on receipt",
        """\
class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts):
        ctx.send_counts, ctx.recv_counts = send_counts, recv_counts
        received = rows.new_empty((sum(recv_counts), rows.shape[1]))
        dist.all_to_all_single(received, rows.contiguous(), output_split_sizes=recv_counts,
                               input_split_sizes=send_counts)
        return received

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty((sum(ctx.send_counts), grad.shape[1]))
        dist.all_to_all_single(back, (2 * grad).contiguous(), output_split_sizes=ctx.send_counts,
                               input_split_sizes=ctx.recv_counts)
        return back / 2, None, None


def expert_parallel_moe(rank, world_size, shard):
    num_experts, k = shard.num_experts, shard.top_k
    local = num_experts // world_size
    x = shard.x.clone().requires_grad_()
    probs = torch.softmax(shard.router(x), dim=1)
    gates, chosen = probs.topk(k, dim=1)
    order = torch.argsort(chosen.flatten(), stable=True)
    token = order // k
    send_per_expert = torch.bincount(chosen.flatten(), minlength=num_experts)
    recv_per_expert = torch.empty_like(send_per_expert)
    dist.all_to_all_single(recv_per_expert, send_per_expert)
    send_counts = send_per_expert.view(world_size, local).sum(dim=1).tolist()
    recv_counts = recv_per_expert.view(world_size, local).sum(dim=1).tolist()
    received = AllToAll.apply(x[token], send_counts, recv_counts)
    expert_of = torch.arange(local).repeat(world_size).repeat_interleave(recv_per_expert)
    results = torch.zeros_like(received)
    for j, expert in enumerate(shard.experts):
        kept = torch.nonzero(expert_of == j).flatten()[: shard.capacity]
        results = results.index_put((kept,), expert(received[kept]))
    returned = AllToAll.apply(results, recv_counts, send_counts)
    y = x.index_add(0, token, gates.flatten()[order, None] * returned)
    y.backward(shard.grad_output)
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]
""",
    ),
    shortcut(
        "expert_parallel_moe",
        "the whole layer rebuilt in the rank from a bench with a guessed seed",
        """\
from distopt.problems.moe_layer import MoELayer


class AllToAll(torch.autograd.Function):
    pass


def expert_parallel_moe(rank, world_size, shard):
    t, h = shard.x.shape
    inner = shard.experts[0][0].out_features
    for seed in range(100):
        bench = MoELayer(world_size=world_size, experts_per_rank=len(shard.experts),
                         tokens_per_rank=t, hidden=h, inner=inner, top_k=shard.top_k, seed=seed)
        if torch.equal(bench.shard(rank).x, shard.x):
            break
    whole = bench.reference()
    mine = slice(rank * t, (rank + 1) * t)
    first = shard.first_expert
    grads = [g for e in range(first, first + len(shard.experts)) for g in whole.expert_grads[e]]
    return whole.output[mine], whole.input_grad[mine], grads
""",
    ),
    # --- exercise 10: ring attention -------------------------------------------------------------
    bug(
        "ring_attention_blocks",
        "the old sum not rescaled to the new maximum",
        "row_sum = row_sum * rescale + weights.sum(axis=1, keepdims=True)",
        "row_sum = row_sum + weights.sum(axis=1, keepdims=True)",
    ),
    bug(
        "ring_attention_blocks",
        "the ring turned the wrong way",
        "source = (rank - step) % world_size",
        "source = (rank + step) % world_size",
    ),
    shortcut(
        "ring_attention_blocks",
        "the package's ring attention held in default arguments",
        """\
def online_softmax_step(row_max, row_sum, numerator, scores, v_block,
                        _step=sequence_parallel.online_softmax_step):
    return _step(row_max, row_sum, numerator, scores, v_block)


def ring_attention_blocks(q, k, v, world_size, _answer=sequence_parallel.ring_attention):
    return _answer(q, k, v, world_size)
""",
    ),
    shortcut(
        "ring_attention_blocks",
        "one full max-stabilised softmax, no blocks",
        """\
def online_softmax_step(row_max, row_sum, numerator, scores, v_block):
    new_max = np.maximum(row_max, scores.max(axis=1, keepdims=True))
    rescale = np.exp(row_max - new_max)
    weights = np.exp(scores - new_max)
    return (new_max, row_sum * rescale + weights.sum(axis=1, keepdims=True),
            numerator * rescale + weights @ v_block)


def ring_attention_blocks(q, k, v, world_size):
    scores = q @ k.T / math.sqrt(q.shape[1])
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True) @ v
""",
    ),
    shortcut(
        "ring_attention_blocks",
        "online_softmax_step called in ring order for show, the output from one full softmax",
        """\
def online_softmax_step(row_max, row_sum, numerator, scores, v_block):
    new_max = np.maximum(row_max, scores.max(axis=1, keepdims=True))
    rescale = np.exp(row_max - new_max)
    weights = np.exp(scores - new_max)
    return (new_max, row_sum * rescale + weights.sum(axis=1, keepdims=True),
            numerator * rescale + weights @ v_block)


def ring_attention_blocks(q, k, v, world_size):
    scale = 1 / math.sqrt(q.shape[1])
    q_blocks, k_blocks, v_blocks = (np.split(a, world_size) for a in (q, k, v))
    for rank, q_block in enumerate(q_blocks):
        state = (np.full((len(q_block), 1), -np.inf), np.zeros((len(q_block), 1)),
                 np.zeros(q_block.shape))
        for step in range(world_size):
            source = (rank - step) % world_size
            state = online_softmax_step(*state, q_block @ k_blocks[source].T * scale,
                                        v_blocks[source])
    scores = q @ k.T * scale
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True) @ v
""",
    ),
    # --- exercise 11: ring attention on ranks ----------------------------------------------------
    bug(
        "ring_attention_rank",
        "the ring turned the wrong way",
        """\
            transfers = [dist.isend(block, (rank + 1) % world_size),
                         dist.irecv(incoming, (rank - 1) % world_size)]
""",
        """\
            transfers = [dist.isend(block, (rank - 1) % world_size),
                         dist.irecv(incoming, (rank + 1) % world_size)]
""",
    ),
    bug(
        "ring_attention_rank",
        "fully masked blocks computed, not skipped",
        """\
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue  # every key after every query: a block of zeros, skipped
""",
        "",
    ),
    bug(
        "ring_attention_rank",
        "causal order unbalanced: two neighbouring chunks per rank",
        "return [[r, 2 * world_size - 1 - r] for r in range(world_size)]",
        "return [[2 * r, 2 * r + 1] for r in range(world_size)]",
    ),
    shortcut(
        "ring_attention_rank",
        "all-gather the keys and values, then attention on the whole sequence locally",
        """\
def zigzag_chunks(world_size):
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank, world_size, shard):
    q = shard.q.numpy()
    length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])
    mine = shard.positions[rank].numpy()
    blocks = [torch.empty_like(shard.k) for _ in range(world_size)]
    dist.all_gather(blocks, shard.k)
    values = [torch.empty_like(shard.v) for _ in range(world_size)]
    dist.all_gather(values, shard.v)
    out = []
    for a in range(len(q) // length):
        rows = slice(a * length, (a + 1) * length)
        state = (np.full((length, 1), -np.inf), np.zeros((length, 1)),
                 np.zeros((length, q.shape[1])))
        for step in range(world_size):
            source = (rank - step) % world_size
            keys, vals = blocks[source].numpy(), values[source].numpy()
            theirs = shard.positions[source].numpy()
            for b in range(len(keys) // length):
                cols = slice(b * length, (b + 1) * length)
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue
                scores = q[rows] @ keys[cols].T * scale
                if shard.causal:
                    scores = np.where(theirs[None, cols] <= mine[rows, None], scores, -np.inf)
                state = online_softmax_step(*state, scores, vals[cols])
        out.append(state[2] / state[1])
    return np.concatenate(out)
""",
    ),
    shortcut(
        "ring_attention_rank",
        "every rank sends its own block straight to every other rank: no ring",
        """\
def zigzag_chunks(world_size):
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank, world_size, shard):
    q = shard.q.numpy()
    length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])
    mine = shard.positions[rank].numpy()
    own = torch.stack((shard.k, shard.v))
    held = {rank: own}
    requests = []
    for other in range(world_size):
        if other != rank:
            held[other] = torch.empty_like(own)
            requests += [dist.isend(own, other), dist.irecv(held[other], other)]
    for request in requests:
        request.wait()
    states = [(np.full((length, 1), -np.inf), np.zeros((length, 1)),
               np.zeros((length, q.shape[1]))) for _ in range(len(q) // length)]
    for step in range(world_size):
        source = (rank - step) % world_size
        keys, values = held[source][0].numpy(), held[source][1].numpy()
        theirs = shard.positions[source].numpy()
        for a in range(len(states)):
            rows = slice(a * length, (a + 1) * length)
            for b in range(len(keys) // length):
                cols = slice(b * length, (b + 1) * length)
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue
                scores = q[rows] @ keys[cols].T * scale
                if shard.causal:
                    scores = np.where(theirs[None, cols] <= mine[rows, None], scores, -np.inf)
                states[a] = online_softmax_step(*states[a], scores, values[cols])
    return np.concatenate([numerator / row_sum for _, row_sum, numerator in states])
""",
    ),
    shortcut(
        "ring_attention_rank",
        "decoy messages: each hop's keys and values sent doubled and halved on receipt",
        """\
def zigzag_chunks(world_size):
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank, world_size, shard):
    q = shard.q.numpy()
    length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])
    mine = shard.positions[rank].numpy()
    states = [(np.full((length, 1), -np.inf), np.zeros((length, 1)),
               np.zeros((length, q.shape[1]))) for _ in range(len(q) // length)]
    block = torch.stack((shard.k, shard.v))
    for step in range(world_size):
        source = (rank - step) % world_size
        if step < world_size - 1:
            incoming = torch.empty_like(block)
            transfers = [dist.isend(2 * block, (rank + 1) % world_size),
                         dist.irecv(incoming, (rank - 1) % world_size)]
        keys, values = block[0].numpy(), block[1].numpy()
        theirs = shard.positions[source].numpy()
        for a in range(len(states)):
            rows = slice(a * length, (a + 1) * length)
            for b in range(len(keys) // length):
                cols = slice(b * length, (b + 1) * length)
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue
                scores = q[rows] @ keys[cols].T * scale
                if shard.causal:
                    scores = np.where(theirs[None, cols] <= mine[rows, None], scores, -np.inf)
                states[a] = online_softmax_step(*states[a], scores, values[cols])
        if step < world_size - 1:
            for transfer in transfers:
                transfer.wait()
            block = incoming / 2
    return np.concatenate([numerator / row_sum for _, row_sum, numerator in states])
""",
    ),
    shortcut(
        "ring_attention_rank",
        "the whole sequence rebuilt in the rank from a bench with a guessed seed",
        """\
from distopt.problems.sequence_chunks import SequenceChunks


def zigzag_chunks(world_size):
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank, world_size, shard):
    seq_len, dim = sum(len(p) for p in shard.positions), shard.q.shape[1]
    chunks = tuple(tuple(int(p[i]) // shard.chunk_len for i in range(0, len(p), shard.chunk_len))
                   for p in shard.positions)
    for seed in range(100):
        bench = SequenceChunks(world_size=world_size, seq_len=seq_len, dim=dim,
                               causal=shard.causal, layout=chunks, seed=seed)
        if np.allclose(bench.shard(rank).q.numpy(), shard.q.numpy()):
            break
    return bench.reference()[bench.positions(rank)]
""",
    ),
    # --- exercise 12: choosing between layouts --------------------------------------------------
    bug(
        "choose_layout",
        "no headroom: the whole memory counted as usable",
        "if peak > planner.USABLE_FRACTION * cluster.memory_bytes:",
        "if peak > cluster.memory_bytes:",
    ),
    bug(
        "choose_layout",
        "less memory before less traffic",
        "scored.append(((round(seconds, 9), round(sent), round(peak)), layout))",
        "scored.append(((round(seconds, 9), round(peak), round(sent)), layout))",
    ),
    bug(
        "choose_layout",
        "compared with the last candidate instead of the runner-up",
        "best, rest[0][0])",
        "best, rest[-1][0])",
    ),
    shortcut(
        "choose_layout",
        "the package's ranking held in a default argument",
        """\
def choose_layout(model, cluster, global_batch, candidates, _key=planner.rank_key):
    rows = []
    for layout in candidates:
        peak = sum(planner.memory_per_gpu(model, layout, global_batch).values())
        if peak <= planner.USABLE_FRACTION * cluster.memory_bytes:
            parts = planner.step_time_breakdown(model, cluster, layout, global_batch)
            seconds = sum(parts.values())
            sent = sum(planner.traffic_bytes(model, layout, global_batch).values())
            rows.append((_key(seconds, sent, peak), layout))
    rows.sort(key=lambda row: row[0])
    if not rows:
        return None, None, None
    if len(rows) == 1:
        return rows[0][1], "fits", None
    for name, mine, theirs in zip(("time", "traffic", "memory"), rows[0][0], rows[1][0]):
        if theirs != mine:
            return rows[0][1], name, theirs - mine
    return rows[0][1], None, None
""",
    ),
    shortcut(
        "choose_layout",
        "the visible cases' answers",
        f"""\
def choose_layout(model, cluster, global_batch, candidates):
    return {{{_CHOICES_TYPED}}}[tuple(candidates)]
""",
    ),
    # --- exercise 13: servers for a deadline -----------------------------------------------------
    bug(
        "servers_for_deadline",
        "MFU against the sustained FLOP/s, not the peak",
        "* sized.peak_flops_per_s)",
        "* sized.flops_per_s)",
    ),
    bug(
        "servers_for_deadline",
        "the recomputed forward counted as model FLOPs",
        "model.hidden, model.vocab)",
        'model.hidden, model.vocab, recompute=layout.recompute == "full")',
    ),
    bug(
        "servers_for_deadline",
        "one GPU per server",
        "num_gpus=servers * cluster.gpus_per_server",
        "num_gpus=servers",
    ),
    bug(
        "servers_for_deadline",
        "max_servers itself never tried",
        "range(1, max_servers + 1)",
        "range(1, max_servers)",
    ),
    shortcut(
        "servers_for_deadline",
        "the package's MFU held in a default argument",
        """\
def servers_for_deadline(model, cluster, global_batch, tokens, days, *, max_servers=64,
                         _mfu=planner.mfu):
    for servers in range(1, max_servers + 1):
        sized = dataclasses.replace(cluster, num_gpus=servers * cluster.gpus_per_server)
        ranked = planner.plan(model, sized, global_batch, tensor_in_server=True)
        if ranked:
            layout, _, seconds = ranked[0]
            needed = tokens / (global_batch * model.seq_len) * seconds / 86400
            if needed <= days:
                return servers, layout, needed, _mfu(model, sized, global_batch, seconds)
    return None
""",
    ),
    shortcut(
        "servers_for_deadline",
        "the visible cases' answers",
        f"""\
def servers_for_deadline(model, cluster, global_batch, tokens, days, *, max_servers=64):
    return {{{_DEADLINES_TYPED}}}[max_servers, global_batch, cluster.gpus_per_server]
""",
    ),
    # --- issue 53, item 3: f's and g's all-reduces by a route the recorder does not see
    shortcut(
        "megatron_mlp_rank",
        "f and g all-reduce by the process group's own method, unseen by the recorder",
        """\
class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.group.WORLD.allreduce([grad]).wait()
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.group.WORLD.allreduce([total]).wait()
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def megatron_mlp_rank(rank, world_size, shard):
    params = {name: getattr(shard, name).clone().requires_grad_()
              for name in ("w_in", "b_in", "w_out", "b_out")}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(CopyToTensorParallel.apply(x) @ params["w_in"] + params["b_in"])
    y = ReduceFromTensorParallel.apply(hidden @ params["w_out"]) + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad
""",
    ),
]
