"""Partly right answers of section 02 (memory and sharding): each passes every visible check of
its exercise and fails a hidden case only (see heldout.py's ``partly``)."""

from tests.grader.mutants import bug, shortcut
from tests.grader.mutants.heldout import partly

PARTLY = [
    # --- Exercise 1: state_bytes_per_gpu ------------------------------------------------------
    # The visible cases use the default widths, 2 + 2 + 12: gradients as wide as the weights.
    partly(
        bug(
            "state_bytes_per_gpu",
            "the gradients counted at the weights' width",
            "    grads = num_params * grad_bytes\n",
            "    grads = num_params * weight_bytes  # 16-bit, like the weights\n",
        )
    ),
    # The visible cases ask for stages 0 to 3 only; a stage beyond 3 is taken as stage 3.
    partly(
        bug(
            "state_bytes_per_gpu",
            "no ValueError: stage 4 counted as stage 3, -1 as stage 0",
            '    if zero_stage not in (0, 1, 2, 3):\n        raise ValueError(f"zero_stage must '
            'be 0, 1, 2 or 3, not {zero_stage!r}")\n',
            "",
        )
    ),
    # --- Exercise 2: min_gpus_to_fit ----------------------------------------------------------
    # The widths are never passed on to state_bytes_per_gpu: right at the default widths of
    # every visible case, wrong at 4 + 4 + 8 or 2 + 2 + 4.
    partly(
        shortcut(
            "min_gpus_to_fit",
            "the byte widths not passed on to state_bytes_per_gpu",
            """\
def min_gpus_to_fit(num_params, zero_stage, device_bytes, *,
                    weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
    one_gpu = state_bytes_per_gpu(num_params, zero_stage, 1)
    if one_gpu <= device_bytes:
        return 1
    # per GPU: replicated + sharded / N, so two GPUs hold replicated + sharded / 2
    replicated = 2 * state_bytes_per_gpu(num_params, zero_stage, 2) - one_gpu
    sharded = one_gpu - replicated
    if sharded <= 0 or replicated >= device_bytes:
        return None
    n = max(1, math.ceil(sharded / (device_bytes - replicated)))
    while n > 1 and state_bytes_per_gpu(num_params, zero_stage, n - 1) <= device_bytes:
        n -= 1
    while state_bytes_per_gpu(num_params, zero_stage, n) > device_bytes:
        n += 1
    return n
""",
        )
    ),
    # floor(x) + 1 for ceil(x): the same where the division is not a whole number (every
    # visible case), one GPU too many where the device is exactly full.
    partly(
        shortcut(
            "min_gpus_to_fit",
            "floor + 1 GPUs: a device exactly full taken as too small",
            """\
def min_gpus_to_fit(num_params, zero_stage, device_bytes, *,
                    weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
    widths = dict(weight_bytes=weight_bytes, grad_bytes=grad_bytes,
                  optimizer_bytes=optimizer_bytes)
    one_gpu = state_bytes_per_gpu(num_params, zero_stage, 1, **widths)
    if one_gpu <= device_bytes:
        return 1
    replicated = 2 * state_bytes_per_gpu(num_params, zero_stage, 2, **widths) - one_gpu
    sharded = one_gpu - replicated
    if sharded <= 0 or replicated >= device_bytes:
        return None
    # the smallest N whose share sharded / N is below what the replicated part leaves free
    return math.floor(sharded / (device_bytes - replicated)) + 1
""",
        ),
        fits="exactly full does not count as fitting",
    ),
    # --- Exercise 3: bytes_sent_per_step ------------------------------------------------------
    # Stage 3 as three transfers of the weights: right while gradients and weights are as wide.
    partly(
        bug(
            "bytes_sent_per_step",
            "stage 3 as three transfers of the weights (gradients as wide as the weights)",
            "return micro_batches * share * (grads + 2 * weights)",
            "return micro_batches * 3 * share * weights  # gather, gather, reduce-scatter",
        )
    ),
    # --- Exercise 4: choose_recompute ---------------------------------------------------------
    # The visible model has s = h = 4096: the sequence length and the width swapped pass it.
    partly(
        bug(
            "choose_recompute",
            "the sequence length and the hidden width swapped in the call",
            "layer_activation_bytes(seq_len, micro_batch, hidden, heads, mode)",
            "layer_activation_bytes(hidden, micro_batch, seq_len, heads, mode)",
        )
    ),
    # --- Exercise 5: peak_bytes_per_gpu -------------------------------------------------------
    # The visible cases have one sequence per micro-batch: the logits of one sequence pass.
    partly(
        bug(
            "peak_bytes_per_gpu",
            "the logits of one sequence: the micro-batch forgotten",
            "logits = 4 * seq_len * micro_batch * vocab  # float32",
            "logits = 4 * seq_len * vocab  # float32 logits of the sequence",
        )
    ),
    # --- Exercise 6: fsdp_peak_bytes ----------------------------------------------------------
    # The pairs start at layer 1: the first layer's backward, nothing prefetched beside it, is
    # never the peak of the visible models; it is for one layer, or a first layer twice the
    # size of the second.
    partly(
        bug(
            "fsdp_peak_bytes",
            "only the pairs (i, i - 1) counted: the first layer alone left out",
            "    for i, num_params in enumerate(layer_num_params):\n"
            "        prefetched = layer_num_params[i - 1] * weight_bytes if i > 0 else 0\n",
            "    for i in range(1, len(layer_num_params)):\n"
            "        num_params = layer_num_params[i]\n"
            "        prefetched = layer_num_params[i - 1] * weight_bytes\n",
        )
    ),
    # --- Exercise 7: fsdp_step_seconds --------------------------------------------------------
    # The visible cases have 2-byte weights and 2-byte gradients.
    partly(
        bug(
            "fsdp_step_seconds",
            "the reduce-scatter timed at the weights' width",
            "return share * num_params * grad_bytes / bandwidth_bytes_per_s",
            "return share * num_params * weight_bytes / bandwidth_bytes_per_s",
        )
    ),
    # --- Exercise 8: zero1_adam ---------------------------------------------------------------
    # The global batch taken as N times this rank's: right for the visible equal shards (8, 8),
    # wrong for the hidden (5, 11, 2).
    partly(
        bug(
            "zero1_adam",
            "the global batch as N times the local one (equal shards assumed)",
            "(problem.loss_sum(model, x, y) / problem.global_batch).backward()",
            "(problem.loss_sum(model, x, y) / (len(y) * world_size)).backward()",
        )
    ),
    # --- Exercise 9: fsdp_sgd -----------------------------------------------------------------
    # Each rank's mean gradient, then the mean over the ranks: the global mean for equal shards
    # only.
    partly(
        shortcut(
            "fsdp_sgd",
            "the mean of the ranks' mean gradients (equal shards assumed)",
            """\
def fsdp_sgd(rank, world_size, bench):
    problem = bench.problem

    def gather(layer, shard):
        full = bench.full_buffer(layer)
        dist.all_gather_single(full, shard)
        out_features, in_features = bench.layer_shapes[layer]
        split = out_features * in_features
        return full[:split].view(out_features, in_features), full[split:split + out_features]

    class ShardedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shard, layer):
            weight, bias = gather(layer, shard)
            ctx.save_for_backward(x, shard)
            ctx.layer = layer
            return x @ weight.T + bias

        @staticmethod
        def backward(ctx, grad_out):
            x, shard = ctx.saved_tensors
            weight, _ = gather(ctx.layer, shard)
            out_features, in_features = bench.layer_shapes[ctx.layer]
            full_grad = torch.zeros(world_size * len(shard), dtype=torch.float64)
            full_grad[:out_features * in_features] = (grad_out.T @ x).reshape(-1)
            full_grad[out_features * in_features:out_features * (in_features + 1)] = grad_out.sum(0)
            grad_shard = torch.empty_like(shard)
            dist.reduce_scatter_single(grad_shard, full_grad)
            grad_shard /= world_size  # the mean over the ranks of their mean gradients
            return grad_out @ weight, grad_shard, None

    shards = [bench.start_shard(rank, layer).requires_grad_() for layer in range(bench.num_layers)]

    def forward(x):
        for layer, shard in enumerate(shards):
            x = ShardedLinear.apply(x, shard, layer)
            if layer < len(shards) - 1:
                x = torch.relu(x)
        return x

    for step in range(problem.steps):
        x, y = problem.batch(step, rank)
        (problem.loss_sum(forward, x, y) / len(y)).backward()  # this rank's mean loss
        with torch.no_grad():
            for shard in shards:
                shard -= problem.lr * shard.grad
                shard.grad = None
    return [shard.detach() for shard in shards]
""",
        )
    ),
    # --- Exercise 10: checkpoint_plan ---------------------------------------------------------
    # The search starts at one block: every visible budget needs a checkpoint; a hidden budget
    # that holds every block's activations needs none.
    partly(
        bug(
            "checkpoint_plan",
            "at least one block checkpointed, even when everything fits",
            "for size in range(n + 1):",
            "for size in range(1, n + 1):",
        )
    ),
]
