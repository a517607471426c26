"""The held-out set: typical mistakes written a second time, never learned from.

autograder/likely_bugs.py learns what each catalogued mistake (the section modules'
``VARIANTS``) looks like from outside. Whether it recognises a mistake it was not trained on
can only be measured on answers it never saw: this module holds them, per notebook. Each is a
:class:`~tests.grader.mutants.Variant` written as another student would write the mistake,
with other code than the catalogue's version (the 1/N forgotten in another line, a loop for
a comprehension, the same wrong formula spelt another way), and labelled with

* ``again(twin, variant)``: the catalogued mistake it writes again (the twin's name, a
  variant of the same answer): the right diagnosis names the twin (its ``hint`` or name);
* ``new(variant)``: a mistake the catalogue does not have: the right diagnosis is none, and
  any name counts as wrong;
* ``partly(variant, fits)``: a *partly right* answer, the most common real mistake: right for
  the visible cases (it passes every visible check) and wrong for a hidden one (other sizes,
  units, widths, edge cases). The right diagnosis is nothing, or the catalogued mistake it
  ``fits`` where one does; a shortcut's name is always wrong (it would accuse an honest
  student). They live one module per notebook in ``tests/grader/mutants/partly/``.

Nothing here is in :func:`tests.grader.mutants.rounds` (the class run and ``learn`` read the
section modules only). Like the catalogue's, each held-out variant must fail exactly its own
exercise's tests (or its ``fails``). ``python -m autograder.likely_bugs heldout [SECTION]``
runs them as students and reports how they are named.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from tests.grader.mutants import Variant, bug, shortcut

NEW = ""  # the twin of a mistake the catalogue does not have


@dataclass(frozen=True)
class HeldOut:
    """A held-out wrong answer and the catalogued mistake it writes again (NEW: none)."""

    variant: Variant
    twin: str = NEW
    partly: bool = False  # right for the visible cases, wrong for a hidden one

    @property
    def known(self) -> bool:
        return self.twin != NEW and not self.partly


def again(twin: str, variant: Variant) -> HeldOut:
    return HeldOut(variant, twin)


def new(variant: Variant) -> HeldOut:
    return HeldOut(variant, NEW)


def partly(variant: Variant, fits: str = NEW) -> HeldOut:
    """A partly right answer; ``fits``: the catalogued mistake whose name would be right."""
    return HeldOut(variant, fits, partly=True)


def partly_right(notebook: str) -> list[HeldOut]:
    """The partly right answers of one notebook (tests/grader/mutants/partly/<notebook>.py)."""
    try:
        module = importlib.import_module(f"tests.grader.mutants.partly.{notebook}")
    except ModuleNotFoundError as exc:
        if exc.name != f"tests.grader.mutants.partly.{notebook}":
            raise
        return []
    return list(module.PARTLY)


def held_out(notebook: str) -> list[HeldOut]:
    """The held-out variants of one notebook (none where it has no entry), partly right
    answers included."""
    return list(HELD_OUT.get(notebook, [])) + partly_right(notebook)


def rounds(notebook: str) -> list[list[HeldOut]]:
    """Held-out students: round k holds the k-th held-out variant of every exercise."""
    by_answer: dict[str, list[HeldOut]] = {}
    for h in held_out(notebook):
        by_answer.setdefault(h.variant.answer, []).append(h)
    depth = max((len(hs) for hs in by_answer.values()), default=0)
    return [[hs[k] for hs in by_answer.values() if k < len(hs)] for k in range(depth)]


HELD_OUT: dict[str, list[HeldOut]] = {
    # --- 01: data parallelism -------------------------------------------------------------
    "data_parallel": [
        again(
            "plain mean of the shard gradients, whatever their sizes",
            bug(
                "data_parallel_step",
                "np.mean over the workers' gradients",
                "averaged = sum(n / total * g for n, g in zip(sizes, gradients))",
                "averaged = np.mean(np.stack(gradients), axis=0)",
            ),
        ),
        again(
            "gradients summed, the 1/N forgotten",
            bug(
                "data_parallel_step",
                "the workers' gradients added with np.sum, never divided",
                "averaged = sum(n / total * g for n, g in zip(sizes, gradients))",
                "averaged = np.sum(gradients, axis=0)",
            ),
        ),
        new(
            bug(
                "data_parallel_step",
                "each gradient weighted by its shard's size, divided by the number of workers",
                "averaged = sum(n / total * g for n, g in zip(sizes, gradients))",
                "averaged = sum(n * g for n, g in zip(sizes, gradients)) / len(shards)",
            )
        ),
        again(
            "all-gather starts one chunk off",
            bug(
                "ring_allreduce",
                "the all-gather passes on the chunk after the one it completed",
                "sends = [(r, (r - step) % n) for r in range(n)]",
                "sends = [(r, (r + 1 - step) % n) for r in range(n)]",
            ),
        ),
        again(
            "ring bandwidth term (N-1)/N instead of 2(N-1)/N",
            bug(
                "fastest_allreduce",
                "the ring's bytes counted once: 1 - 1/N of the message",
                '"ring": (2 * (n - 1), 2 * (n - 1) / n),',
                '"ring": (2 * (n - 1), 1 - 1 / n),',
            ),
        ),
        again(
            "each rank's mean loss, summed over ranks (no weighting by shard size)",
            bug(
                "naive_data_parallel",
                "the local mean loss: divided by the local batch's rows",
                "(problem.loss_sum(model, x, y) / problem.global_batch).backward()",
                "loss = problem.loss_sum(model, x, y) / x.shape[0]\n        loss.backward()",
            ),
        ),
        new(
            bug(
                "naive_data_parallel",
                "the mean of the ranks' mean gradients: all-reduced, then divided by N",
                "            dist.all_reduce(p.grad)  # the sum of the shares is the global mean's "
                "gradient\n",
                "            p.grad *= problem.global_batch / len(y)  # this rank's mean gradient\n"
                "            dist.all_reduce(p.grad)\n"
                "            p.grad /= world_size\n",
            )
        ),
        again(
            "(N-1)/N for 2(N-1)/N in the bandwidth term",
            bug(
                "fit_alpha_beta",
                "the bandwidth term written as (1 - 1/N) M",
                "2 * (n - 1) / n * m],",
                "(1 - 1 / n) * m],",
            ),
        ),
        again(
            "plain least squares on the times, not on the relative error",
            shortcut(
                "fit_alpha_beta",
                "a straight line through the times by np.polyfit",
                """\
def fit_alpha_beta(message_bytes, times_s, world_size):
    n = world_size
    x = 2 * (n - 1) / n * np.asarray(message_bytes, dtype=float)
    slope, intercept = np.polyfit(x, np.asarray(times_s, dtype=float), 1)
    return float(intercept / (2 * (n - 1))), float(1 / slope)
""",
            ),
        ),
        again(
            "the last bucket forgotten",
            bug(
                "exposed_communication_s",
                "only the buckets after the first add up, in a loop",
                "return bucket_s + (num_buckets - 1) * max(0.0, bucket_s - fill_s)",
                "exposed = 0.0\n    for _ in range(1, num_buckets):\n"
                "        exposed += max(0.0, bucket_s - fill_s)\n    return exposed",
            ),
        ),
        again(
            "the summed buckets never copied back into the gradients",
            bug(
                "bucketed_data_parallel",
                "the summed piece bound to a local name, not written into p.grad",
                "                p.grad.copy_(piece.view_as(p))",
                "                grad = p.grad\n                grad = piece.view_as(p)",
            ),
        ),
        again(
            "gradients zeroed before every micro-batch",
            bug(
                "accumulating_data_parallel",
                "the gradients set to None at the start of every micro-batch",
                "            x, y = problem.micro_batch(step, rank, k)\n",
                "            x, y = problem.micro_batch(step, rank, k)\n"
                "            for p in model.parameters():\n"
                "                p.grad = None\n",
            ),
        ),
        new(
            bug(
                "accumulating_data_parallel",
                "each micro-batch's loss divided by its own size, not the global batch",
                "(problem.loss_sum(model, x, y) / problem.global_batch).backward()",
                "(problem.loss_sum(model, x, y) / len(y)).backward()",
            )
        ),
    ],
    # --- 02: memory and sharding -----------------------------------------------------------
    "memory_sharding": [
        again(
            "weights sharded from stage 2",
            bug(
                "state_bytes_per_gpu",
                "the weights sharded in the gradients' branch",
                "    if zero_stage >= 2:\n        grads /= world_size\n"
                "    if zero_stage >= 3:\n        weights /= world_size\n",
                "    if zero_stage >= 2:\n        grads /= world_size\n"
                "        weights /= world_size\n",
            ),
        ),
        new(
            bug(
                "state_bytes_per_gpu",
                "the gradients never sharded",
                "        grads /= world_size\n",
                "        grads = grads  # kept whole\n",
            )
        ),
        again(
            "stage 3 gathers the weights once",
            bug(
                "bytes_sent_per_step",
                "stage 3: one gather and one reduce-scatter per micro-batch, added",
                "return micro_batches * share * (grads + 2 * weights)",
                "return micro_batches * share * grads + micro_batches * share * weights",
            ),
        ),
        again(
            "the least memory first: full recomputation whenever it fits",
            bug(
                "choose_recompute",
                "the modes tried in reverse",
                'for mode in ("none", "selective", "full"):',
                'for mode in reversed(("none", "selective", "full")):',
            ),
        ),
        again(
            "the prefetched layer counted with a gradient too",
            bug(
                "fsdp_peak_bytes",
                "the prefetched layer's gradient bytes added to its weights",
                "prefetched = layer_num_params[i - 1] * weight_bytes if i > 0 else 0",
                "prefetched = (layer_num_params[i - 1] * weight_bytes\n"
                "                      + layer_num_params[i - 1] * grad_bytes) if i > 0 else 0",
            ),
        ),
        again(
            "Adam without bias correction",
            bug(
                "zero1_adam",
                "neither moment bias-corrected",
                "denominator = (v / (1 - beta2**step)).sqrt() + eps\n"
                "        new_slice = flat_weights[mine] - problem.adam_lr "
                "* (m / (1 - beta1**step)) / denominator",
                "denominator = v.sqrt() + eps\n"
                "        new_slice = flat_weights[mine] - problem.adam_lr * m / denominator",
            ),
        ),
        new(
            bug(
                "zero1_adam",
                "the moments started from zero at every step",
                "        m.mul_(beta1).add_(grad, alpha=1 - beta1)\n",
                "        m, v = torch.zeros_like(m), torch.zeros_like(v)\n"
                "        m.mul_(beta1).add_(grad, alpha=1 - beta1)\n",
            )
        ),
        again(
            "the reduce-scattered gradient averaged over the ranks: divided by N twice",
            bug(
                "fsdp_sgd",
                "the shard's step divided by the world size",
                "shard -= problem.lr * shard.grad  # plain SGD, on the shard only",
                "shard -= problem.lr * shard.grad / world_size",
            ),
        ),
        new(
            bug(
                "fsdp_sgd",
                "the loss divided by the local batch, not the global one",
                "(problem.loss_sum(forward, x, y) / problem.global_batch).backward()",
                "(problem.loss_sum(forward, x, y) / len(y)).backward()",
            )
        ),
        again(
            "a budget met exactly does not fit",
            bug(
                "checkpoint_plan",
                "a choice fits only strictly under the budget",
                "if kept > budget_bytes:",
                "if not kept < budget_bytes:",
            ),
        ),
    ],
    # --- 03: model parallelism ------------------------------------------------------------
    "model_parallel": [
        again(
            "f's backward forgets the sum over the ranks",
            bug(
                "megatron_mlp_rank",
                "f left out: x multiplied by this rank's w_in directly",
                'F.gelu(CopyToTensorParallel.apply(x) @ params["w_in"]',
                'F.gelu(x @ params["w_in"]',
            ),
        ),
        again(
            "b_out added on every rank before g",
            bug(
                "megatron_mlp_rank",
                "the partial output with b_out, then reduced",
                'y = ReduceFromTensorParallel.apply(hidden @ params["w_out"]) + params["b_out"]',
                'partial = hidden @ params["w_out"] + params["b_out"]\n'
                "    y = ReduceFromTensorParallel.apply(partial)",
            ),
        ),
        again(
            "interleaving forgotten",
            bug(
                "bubble_fraction_formula",
                "the GPipe fraction (p - 1) / (m + p - 1) whatever the interleaving",
                "return idle / (micro_batches + idle)",
                "return (stages - 1) / (micro_batches + stages - 1)",
            ),
        ),
        new(
            bug(
                "bubble_fraction_formula",
                "idle over m + p, not m + idle",
                "return idle / (micro_batches + idle)",
                "return idle / (micro_batches + stages)",
            )
        ),
        again(
            "1F1B's extra forward before the first backward forgotten",
            bug(
                "max_in_flight_formula",
                "the stages after this one, without itself",
                "return min(stages - stage, micro_batches)",
                "after = stages - 1 - stage\n        return min(after, micro_batches)",
            ),
        ),
        again(
            "the loss not divided by the batch size",
            bug(
                "gpipe_stage",
                "the summed loss of each micro-batch, kept in a variable",
                "out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size",
                "loss = stage.loss_sum(out, stage.targets[k])\n            out = loss",
            ),
        ),
        new(
            bug(
                "gpipe_stage",
                "each micro-batch's mean loss: divided by the micro-batch size",
                "out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size",
                "out = stage.loss_sum(out, stage.targets[k]) / stage.micro_batch",
            )
        ),
        again(
            "sender and receiver swapped",
            bug(
                "all_to_all_counts",
                "the counts matrix returned transposed",
                "    return counts\n",
                "    return counts.T\n",
            ),
        ),
        again(
            "capacity counted in tokens, not token copies",
            bug(
                "dropped_copies_at",
                "the capacity from the number of rows",
                "capacity = math.ceil(round(capacity_factor * tokens * k / num_experts, 9))",
                "capacity = math.ceil(round(capacity_factor * len(chosen_experts) "
                "/ num_experts, 9))",
            ),
        ),
        again(
            "the factor E forgotten",
            bug(
                "load_balancing_loss",
                "the dot product of f and the mean P, unscaled",
                "return float(num_experts * np.sum(fraction * probs.mean(axis=0)))",
                "return float(np.dot(fraction, probs.mean(axis=0)))",
            ),
        ),
        new(
            bug(
                "load_balancing_loss",
                "f from each token's first choice only",
                "fraction = np.bincount(chosen_experts.ravel(), minlength=num_experts) "
                "/ (tokens * k)",
                "fraction = np.bincount(chosen_experts[:, 0], minlength=num_experts) / tokens",
            )
        ),
        again(
            "dropped copies kept: no capacity",
            bug(
                "expert_parallel_moe",
                "every queued copy run through its expert",
                "results = results.index_put((kept,), expert(received[kept]))",
                "results = results.index_put((queue,), expert(received[queue]))",
            ),
        ),
        new(
            bug(
                "ring_attention_blocks",
                "the numerator not rescaled to the new maximum",
                "numerator = numerator * rescale + weights @ v_block",
                "numerator = numerator + weights @ v_block",
            )
        ),
        again(
            "the ring turned the wrong way",
            bug(
                "ring_attention_rank",
                "the block sent to rank - 1 and received from rank + 1, by name",
                "            transfers = [dist.isend(block, (rank + 1) % world_size),\n"
                "                         dist.irecv(incoming, (rank - 1) % world_size)]\n",
                "            ahead, behind = (rank - 1) % world_size, (rank + 1) % world_size\n"
                "            transfers = [dist.isend(block, ahead), "
                "dist.irecv(incoming, behind)]\n",
            ),
        ),
    ],
    # --- 04: optimizers for very large batches --------------------------------------------
    "large_batch": [
        again(
            "ratio inverted: base_batch / batch_size",
            bug(
                "linear_scaled_lr",
                "the lr divided by how many base batches the batch holds",
                "return base_lr * batch_size / base_batch",
                "scale = batch_size / base_batch\n    return base_lr / scale",
            ),
        ),
        again(
            "cosine decays to 0, final_lr ignored",
            bug(
                "warmup_cosine_lr",
                "the half-cosine written as cos^2, from peak_lr down to 0",
                "return final_lr + (peak_lr - final_lr) * (1 + math.cos(math.pi * progress)) / 2",
                "return peak_lr * math.cos(math.pi * progress / 2) ** 2",
            ),
        ),
        again(
            "warm-up off by one: step / warmup_steps starts at 0",
            bug(
                "warmup_cosine_lr",
                "the warm-up from 0 to the peak over warmup_steps - 1 steps",
                "return peak_lr * (step + 1) / warmup_steps",
                "return peak_lr * step / max(1, warmup_steps - 1)",
            ),
        ),
        new(
            bug(
                "warmup_cosine_lr",
                "warm-up reaches peak_lr one step late: (step + 1) / (warmup_steps + 1)",
                "return peak_lr * (step + 1) / warmup_steps",
                "return peak_lr * (step + 1) / (warmup_steps + 1)",
            )
        ),
        again(
            "weight decay left out of the trust ratio's denominator",
            bug(
                "lars_step",
                "the trust ratio from the raw gradient's norm, recomputed in the ratio",
                "ratio = w_norm / denominator if w_norm > 0 and denominator > 0 else 1.0",
                "g_norm = np.sqrt(np.sum(g * g))\n"
                "    ratio = w_norm / g_norm if w_norm > 0 and g_norm > 0 else 1.0",
            ),
        ),
        again(
            "no bias correction of the moments",
            bug(
                "lamb_step",
                "the moments' bias corrections left out (m_hat = m, v_hat = v)",
                "m_hat = m / (1 - beta1**step)\n    v_hat = v / (1 - beta2**step)",
                "m_hat, v_hat = m, v  # the moments as they are",
            ),
        ),
        new(
            bug(
                "lamb_step",
                "bias corrections one step ahead: 1 - beta**(step + 1)",
                "m_hat = m / (1 - beta1**step)\n    v_hat = v / (1 - beta2**step)",
                "m_hat = m / (1 - beta1 ** (step + 1))\n    v_hat = v / (1 - beta2 ** (step + 1))",
            )
        ),
        again(
            "the global norm without the square root",
            bug(
                "clip_by_global_norm",
                "the squared layer norms summed, the root never taken",
                "total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))",
                "total = 0.0\n    for g in grads:\n        total += float(np.linalg.norm(g)) ** 2",
            ),
        ),
        new(
            bug(
                "clip_by_global_norm",
                "the layers' norms added (not the root of their squares)",
                "total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))",
                "total = sum(float(np.linalg.norm(g)) for g in grads)",
            )
        ),
    ],
    # --- 05: asynchronous and decentralized optimization ----------------------------------
    "async_decentralized": [
        again(
            "backups ignored: the maximum of all N + b delays",
            bug(
                "expected_sync_step_time",
                "the harmonic number of all N + b workers, in a loop",
                "return base_s + mean_delay_s * sum(1 / k for k in "
                "range(num_backup + 1, total + 1))",
                "harmonic = 0.0\n    for k in range(total):\n        harmonic += 1 / (k + 1)\n"
                "    return base_s + mean_delay_s * harmonic",
            ),
        ),
        again(
            "harmonic sum off by one: H_{N+b} - H_{b+1}",
            bug(
                "expected_sync_step_time",
                "the harmonic sum stops one term early: H_{N+b-1} - H_b",
                "range(num_backup + 1, total + 1)",
                "range(num_backup + 1, total)",
            ),
        ),
        again(
            "divided by staleness + 1",
            bug(
                "staleness_aware_lr",
                "one plus the staleness as the divisor, via a variable",
                "return base_lr / max(1, staleness)",
                "divisor = 1 + staleness\n    return base_lr / divisor",
            ),
        ),
        new(
            bug(
                "staleness_aware_lr",
                "divided by the staleness squared",
                "return base_lr / max(1, staleness)",
                "return base_lr / max(1, staleness) ** 2",
            )
        ),
        again(
            "strictly below the target (< for <=)",
            shortcut(
                "time_to_reach",
                "the first index strictly below the target, by numpy",
                """\
def time_to_reach(times_s, excess_loss, target):
    below = np.flatnonzero(np.asarray(excess_loss) < target)
    return float(times_s[below[0]]) if len(below) else math.inf
""",
            ),
        ),
        again(
            "staleness counted with this update (one too many)",
            bug(
                "async_server",
                "the version bumped before the staleness is read",
                "        tau = version - read_version  # updates applied since that worker read w\n"
                "        w = w - bench.step_size(tau) * gradient\n"
                "        version += 1\n",
                "        version += 1\n"
                "        tau = version - read_version\n"
                "        w = w - bench.step_size(tau) * gradient\n",
            ),
        ),
        again(
            "the step size not scaled by the staleness",
            bug(
                "async_server",
                "every gradient stepped as if it were fresh: step_size(0)",
                "w = w - bench.step_size(tau) * gradient",
                "w = w - bench.step_size(0) * gradient  # the full step",
            ),
        ),
        again(
            "edge weight 1 / (1 + deg_i): own degree only, not symmetric",
            shortcut(
                "metropolis_hastings",
                "each row's edges weighted by 1 / (1 + its own degree), vectorised",
                """\
def metropolis_hastings(adjacency):
    a = np.asarray(adjacency, dtype=float)
    np.fill_diagonal(a, 0.0)
    w = a / (1.0 + a.sum(axis=1, keepdims=True))
    return w + np.diag(1.0 - w.sum(axis=1))
""",
            ),
        ),
        new(
            bug(
                "metropolis_hastings",
                "edge weight 1 / (deg_i + deg_j)",
                "weights[i, j] = 1.0 / (1 + max(degree[i], degree[j]))",
                "weights[i, j] = 1.0 / (degree[i] + degree[j])",
            )
        ),
        again(
            "the largest magnitude, lambda_1 = 1",
            bug(
                "second_largest_eigenvalue_magnitude",
                "the spectral radius from np.linalg.eigvals",
                "magnitudes = np.sort(np.abs(np.linalg.eigvalsh("
                "np.asarray(weights, dtype=float))))\n"
                "    return float(magnitudes[-2])",
                "return float(max(abs(np.linalg.eigvals(np.asarray(weights, dtype=float)))))",
            ),
        ),
        again(
            "heavy-ball momentum instead of Nesterov's look-ahead",
            bug(
                "diloco_outer_step",
                "the params stepped along grad + momentum * the old velocity",
                "new_params = np.asarray(params) - lr * (outer_grad + momentum * new_velocity)",
                "step = outer_grad + momentum * np.asarray(velocity)\n"
                "    new_params = np.asarray(params) - lr * step",
            ),
        ),
        new(
            bug(
                "ring_gossip_sgd",
                "the right neighbour's model ignored: the left one counted twice",
                "x = (y + from_left + from_right) / 3",
                "x = (y + 2 * from_left) / 3",
                fails=("test_ring_gossip_sgd",),
            )
        ),
    ],
    # --- 06: federated learning -----------------------------------------------------------
    "federated": [
        again(
            "the plain mean of the models, clients not weighted by size",
            bug(
                "fedavg",
                "the models added up and divided by how many there are",
                "w = np.average(models, axis=0, weights=sizes)",
                "w = sum(models) / len(models)",
            ),
        ),
        again(
            "no copy: the clients train one after another on the global model",
            bug(
                "fedavg",
                "np.asarray in place of a copy: the local steps change the global model",
                "local = w.copy()",
                "local = np.asarray(w)",
            ),
        ),
        again(
            "one step short",
            bug(
                "centralized_sgd",
                "the steps counted from 1",
                "for _ in range(steps):",
                "for step in range(1, steps):",
            ),
        ),
        new(
            bug(
                "client_drift",
                "the mean squared distance (no square root)",
                "return float(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1)))",
                "return float(np.mean(np.sum((models - models.mean(axis=0)) ** 2, axis=1)))",
            )
        ),
        again(
            "the proximal term with the wrong sign (pushes away from the global model)",
            bug(
                "fedprox",
                "the proximal gradient subtracted from the loss's gradient",
                "+ mu * (local - w)",
                "- mu * (local - w)",
            ),
        ),
        new(
            bug(
                "fedprox",
                "the proximal term pulls towards 0 (weight decay), not towards the global model",
                "+ mu * (local - w)",
                "+ mu * local",
            )
        ),
        again(
            "the correction with the wrong sign, + c_k - c",
            bug(
                "scaffold",
                "the correction added as (c_k - c)",
                "- client_c[k] + c)",
                "+ (client_c[k] - c))",
            ),
        ),
        again(
            "the plain mean of the round's models",
            bug(
                "fedavg_over_ranks",
                "the round's models stacked and averaged in torch",
                "w = torch.from_numpy(np.average(models, axis=0, weights=sizes))",
                "w = torch.stack([torch.from_numpy(m) for m in models]).mean(dim=0)",
            ),
        ),
        again(
            "both clients of a pair add the mask (the masks do not cancel)",
            shortcut(
                "masked_update",
                "every mask of a pair the client is in added",
                """\
def masked_update(update, client, pair_seeds, *, mask_scale):
    out = np.array(update, dtype=float)
    for pair, seed in pair_seeds.items():
        if client in pair:
            out = out + federated.pair_mask(seed, out.shape[0], scale=mask_scale)
    return out
""",
            ),
        ),
        new(
            shortcut(
                "secure_sum",
                "the masked vectors added, no mask removed",
                """\
def secure_sum(masked, pair_seeds, *, mask_scale):
    return np.sum([np.asarray(v, dtype=float) for v in masked.values()], axis=0)
""",
            )
        ),
        again(
            "noise added to the mean instead of the sum",
            bug(
                "private_mean",
                "the clipped mean first, the noise on top of it",
                "return (clipped.sum(axis=0) + noise) / len(updates)",
                "mean = clipped.mean(axis=0)\n    return mean + noise",
            ),
        ),
        again(
            "noise std sigma, not scaled by the clip norm (the sensitivity)",
            bug(
                "private_mean",
                "the noise as sigma times a standard normal draw",
                "noise = rng.normal(0.0, noise_multiplier * clip_norm, updates.shape[1])",
                "noise = noise_multiplier * rng.standard_normal(updates.shape[1])",
            ),
        ),
    ],
    # --- 07: the training project ---------------------------------------------------------
    "training_project": [
        new(
            bug(
                "width_for_params",
                "the embeddings counted, the 13 l biases and norms left out",
                "b = 13 * layers + vocab + seq_len",
                "b = vocab + seq_len",
            )
        ),
        again(
            "2ND: the forward pass only",
            bug(
                "training_days",
                "the FLOPs of the forward pass, 2 per parameter and token",
                "flops = 6 * num_params * num_tokens",
                "flops = num_params * num_tokens * 2  # FLOPs per token: 2 N",
            ),
        ),
        new(
            bug(
                "training_days",
                "hours, not days: divided by 3,600",
                "return seconds / 86_400",
                "return seconds / 3600",
            )
        ),
        again(
            "checkpointing without the recomputed layer's full activations",
            bug(
                "memory_per_device",
                "the checkpoints of every layer summed, nothing more",
                "activations = layers * stored + full_layer",
                "activations = sum(stored for _ in range(layers))",
            ),
        ),
        again(
            "the training state never sharded",
            bug(
                "memory_per_device",
                "the training state counted on one device",
                "world_size=world_size)",
                "world_size=1)  # the whole state",
            ),
        ),
        again(
            "decay on the norms and biases too",
            shortcut(
                "decay_groups",
                "every trainable parameter decayed",
                """\
def decay_groups(model, weight_decay):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": trainable, "weight_decay": weight_decay},
            {"params": [], "weight_decay": 0.0}]
""",
            ),
        ),
        new(
            bug(
                "adamw_step",
                "the decay applied twice: decoupled and added to the gradient",
                "m = beta1 * m + (1 - beta1) * grad\n",
                "grad = grad + weight_decay * param\n    m = beta1 * m + (1 - beta1) * grad\n",
            )
        ),
        again(
            "keeps len // eta rounded up",
            bug(
                "promote",
                "math.ceil of len / eta kept",
                "keep = max(1, len(losses) // eta)",
                "keep = max(1, math.ceil(len(losses) / eta))",
            ),
        ),
        again(
            "2N: forward FLOPs only",
            bug(
                "model_flops_utilization",
                "a third of the training FLOPs: the forward pass",
                "per_token = 6 * weights + 3 * attention",
                "per_token = (6 * weights + 3 * attention) / 3",
            ),
        ),
        again(
            "the hidden rate scaled the wrong way, times width / base_width",
            bug(
                "mup_learning_rates",
                "the hidden rate times the width ratio, written out",
                '"hidden": base_lr / width_mult',
                '"hidden": base_lr * width / base_width',
            ),
        ),
        new(
            bug(
                "mup_learning_rates",
                "the hidden rate divided by the square root of the width ratio",
                '"hidden": base_lr / width_mult',
                '"hidden": base_lr / math.sqrt(width_mult)',
            )
        ),
        again(
            "the hidden rate not scaled with the width (SP)",
            shortcut(
                "mup_learning_rates",
                "standard parametrisation: every rate base_lr, no logit multiplier",
                """\
def mup_learning_rates(base_lr, base_width, width):
    names = ("hidden", "embedding", "readout", "vector")
    return {**{name: base_lr for name in names}, "logit_multiplier": 1.0}
""",
            ),
        ),
    ],
}
