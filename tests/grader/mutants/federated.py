"""Mutants of section 06 (federated learning): see tests/grader/mutants/__init__.py."""

from tests.grader.mutants import bug, shortcut

# The models the visible tests compare with (the package's runs on the lesson's data), as a
# student could print and paste them: the "lookup" shortcuts return these.
_FEDAVG_SEED6 = [0.09829540395093363, 0.09935961319949087, -0.3610501200059087,
                 0.018643275389875875, 0.09757610447612772, 0.2524410918315515,
                 0.05645909396500646, 0.2161687600309366, 0.09208729758019757,
                 0.1369194085128478]  # fmt: skip
_CENTRAL_SEED6 = [0.1530705557284302, 0.10091126839333092, -0.5039349938254142,
                  0.05464929829268496, 0.15958928937732747, 0.3248765046571067,
                  0.036505921993812245, 0.3016016235447637, 0.12937438621659486,
                  0.1708877410144728]  # fmt: skip
_HETERO_FEDAVG = [-0.013024658491503808, 0.09447611839299376, -0.2812662693566679,
                  -0.020807737341158365, 0.014355677655649745, 0.1311685582348442,
                  0.21873147434142312, 0.1670443211291631, 0.05498786561142841,
                  0.2629903094110976]  # fmt: skip
_HETERO_FEDPROX = [-0.012803843709622653, 0.07394771210365124, -0.23708891845850216,
                   -0.02190495762142806, 0.013551904632442786, 0.11435492645787489,
                   0.18684089984294483, 0.14473090788361795, 0.044455297403741635,
                   0.22824894095332432]  # fmt: skip
_HETERO_ROUND1 = [-0.020109420300718897, 0.03493852897547812, -0.11773147505305825,
                  -0.013643466062463435, 0.0013127911168726082, 0.06661727713775761,
                  0.10552433896193991, 0.08296408666098122, 0.014287603127673484,
                  0.12283133844314562]  # fmt: skip
_HETERO_SCAFFOLD = [-0.037348300079868106, 0.12508743359960836, -0.3977013388108398,
                    0.009236015077287236, 0.020954687489399385, 0.15156057276308882,
                    0.3090455817311019, 0.19493195248433368, 0.07120912822725897,
                    0.381819454176779]  # fmt: skip

VARIANTS = [
    # --- fedavg ------------------------------------------------------------------------
    bug(
        "fedavg",
        "the plain mean of the models, clients not weighted by size",
        "w = np.average(models, axis=0, weights=sizes)",
        "w = np.mean(models, axis=0)",
    ),
    bug(
        "fedavg",
        "no copy: the clients train one after another on the global model",
        "local = w.copy()",
        "local = w",
    ),
    shortcut(
        "fedavg",
        "local steps written, the weighting left to the package's average_models",
        """\
def fedavg(problem, local_steps, *, rounds=30, lr=0.1, batch_size=32,
           _average=federated.average_models):
    w = np.zeros(problem.dim)
    for _ in range(rounds):
        models = []
        for X, y in problem.clients:
            local = w.copy()
            for _ in range(local_steps):
                idx = problem.rng.choice(len(y), batch_size)
                local -= lr * logistic_grad(local, X[idx], y[idx])
            models.append(local)
        w = _average(np.array(models), problem.client_sizes, "examples")
    return w
""",
    ),
    shortcut(
        "fedavg",
        "the visible test's model pasted",
        f"""\
def fedavg(problem, local_steps, *, rounds=30, lr=0.1, batch_size=32):
    return np.array({_FEDAVG_SEED6!r})
""",
    ),
    # --- centralized_sgd ---------------------------------------------------------------
    bug(
        "centralized_sgd",
        "minibatches drawn without replacement",
        "idx = problem.rng.choice(len(y), batch_size)",
        "idx = problem.rng.choice(len(y), batch_size, replace=False)",
    ),
    bug(
        "centralized_sgd",
        "one step short",
        "for _ in range(steps):",
        "for _ in range(steps - 1):",
    ),
    shortcut(
        "centralized_sgd",
        "the package's answer held in a default argument",
        """\
def centralized_sgd(problem, steps, *, lr=0.1, batch_size=320, _f=federated.centralized_sgd):
    return _f(problem, steps, lr=lr, batch_size=batch_size)
""",
    ),
    shortcut(
        "centralized_sgd",
        "the visible test's model pasted",
        f"""\
def centralized_sgd(problem, steps, *, lr=0.1, batch_size=320):
    return np.array({_CENTRAL_SEED6!r})
""",
    ),
    # --- client_drift ------------------------------------------------------------------
    bug(
        "client_drift",
        "root mean square distance instead of the mean distance",
        "return float(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1)))",
        "return float(np.sqrt(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1) ** 2)))",
    ),
    bug(
        "client_drift",
        "distances from the first client's model, not from the average",
        "return float(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1)))",
        "return float(np.mean(np.linalg.norm(models - models[0], axis=1)))",
    ),
    shortcut(
        "client_drift",
        "the package's answer in a dict",
        """\
_answers = {"drift": federated.client_drift}

def client_drift(models):
    return _answers["drift"](np.asarray(models, dtype=float))
""",
    ),
    shortcut(
        "client_drift",
        "the visible cases looked up",
        """\
def client_drift(models):
    models = np.asarray(models, dtype=float)
    if len(models) == 2:
        return float(np.linalg.norm(models[0] - models[1]) / 2)
    return 0.0
""",
    ),
    # --- fedprox -----------------------------------------------------------------------
    bug(
        "fedprox",
        "the plain mean of the models, clients not weighted by size",
        "w = np.average(models, axis=0, weights=sizes)  # client k weighs n_k / n",
        "w = np.mean(models, axis=0)",
    ),
    bug(
        "fedprox",
        "the proximal term with the wrong sign (pushes away from the global model)",
        "+ mu * (local - w)",
        "+ mu * (w - local)",
    ),
    bug(
        "fedprox",
        "the gradient of mu/2 ||w - w_global||^2 taken as mu/2 (w - w_global)",
        "+ mu * (local - w)",
        "+ mu / 2 * (local - w)",
    ),
    shortcut(
        "fedprox",
        "the package's simulator in a functools.partial",
        """\
_prox = functools.partial(federated.run_federated, algorithm="fedprox")

def fedprox(problem, local_steps, *, mu, rounds=30, lr=0.1, batch_size=32):
    return _prox(problem, local_steps=local_steps, rounds=rounds, lr=lr,
                 batch_size=batch_size, mu=mu).w
""",
    ),
    shortcut(
        "fedprox",
        "the visible test's models pasted",
        f"""\
def fedprox(problem, local_steps, *, mu, rounds=30, lr=0.1, batch_size=32):
    return np.array({_HETERO_FEDAVG!r} if mu == 0 else {_HETERO_FEDPROX!r})
""",
    ),
    # --- scaffold ----------------------------------------------------------------------
    bug(
        "scaffold",
        "models weighted by size, but c moved by the plain mean of the changes (the paper's 1/N)",
        "c = c + shares @ np.array(c_changes)",
        "c = c + np.sum(c_changes, axis=0) / n",
    ),
    bug(
        "scaffold",
        "the clients' control variates never updated",
        "            client_c[k] = new_c\n",
        "",
    ),
    bug(
        "scaffold",
        "the correction with the wrong sign, + c_k - c",
        "- client_c[k] + c)",
        "+ client_c[k] - c)",
    ),
    shortcut(
        "scaffold",
        "the package's simulator held in a default argument",
        """\
def scaffold(problem, local_steps, *, rounds=30, lr=0.1, batch_size=32,
             _run=federated.run_federated):
    return _run(problem, local_steps=local_steps, rounds=rounds, lr=lr,
                batch_size=batch_size, algorithm="scaffold").w
""",
    ),
    shortcut(
        "scaffold",
        "the visible test's models pasted",
        f"""\
def scaffold(problem, local_steps, *, rounds=30, lr=0.1, batch_size=32):
    return np.array({_HETERO_ROUND1!r} if rounds == 1 else {_HETERO_SCAFFOLD!r})
""",
    ),
    # --- fedavg_over_ranks -------------------------------------------------------------
    bug(
        "fedavg_over_ranks",
        "the plain mean of the round's models",
        "w = torch.from_numpy(np.average(models, axis=0, weights=sizes))",
        "w = torch.from_numpy(np.mean(models, axis=0))",
    ),
    bug(
        "fedavg_over_ranks",
        "no final broadcast: the clients keep the model of their last round",
        "    dist.broadcast(w, src=0)  # every rank ends with the final model\n",
        "",
    ),
    shortcut(
        "fedavg_over_ranks",
        "the package's secure FedAvg, masks left out, held in a default argument",
        """\
def fedavg_over_ranks(rank, world_size, bench, _f=federated_ranks.secure_fedavg_ranks):
    return _f(rank, world_size, bench, lambda update, client, seeds, mask_scale: update)["w"]
""",
    ),
    shortcut(
        "fedavg_over_ranks",
        "every rank computes the whole run locally, no messages",
        """\
def fedavg_over_ranks(rank, world_size, bench):
    problem = bench._problem(client_streams=True)  # every client's data, on every rank
    w = np.zeros(bench.dim)
    for chosen in bench.participants():
        models = []
        for k in chosen:
            X, y = problem.clients[k]
            local = w.copy()
            for _ in range(bench.steps_of(k)):
                idx = problem.client_rngs[k].integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            models.append(local)
        w = np.average(models, axis=0, weights=[bench.client_sizes[k] for k in chosen])
    return w
""",
    ),
    # Issue 53: a client's data stay on its rank; every message's contents are read.
    shortcut(
        "fedavg_over_ranks",
        "the server trains every client itself on their data, the clients send decoys",
        """\
def fedavg_over_ranks(rank, world_size, bench):
    w = np.zeros(bench.dim)
    if rank == 0:
        data = [bench.client_data(k) for k in range(bench.num_clients)]
        rngs = [bench.client_rng(k) for k in range(bench.num_clients)]
    for chosen in bench.participants():
        if rank == 0:
            models = []
            for k in chosen:
                dist.send(torch.from_numpy(w), dst=k + 1)
                decoy = torch.empty(bench.dim, dtype=torch.float64)
                dist.recv(decoy, src=k + 1)
                (X, y), local = data[k], w.copy()
                for _ in range(bench.steps_of(k)):
                    idx = rngs[k].integers(0, len(y), bench.batch_size)
                    local -= bench.lr * logistic_grad(local, X[idx], y[idx])
                models.append(local)
            w = np.average(models, axis=0, weights=[bench.client_sizes[k] for k in chosen])
        elif rank - 1 in chosen:
            dist.recv(torch.empty(bench.dim, dtype=torch.float64), src=0)
            dist.send(torch.zeros(bench.dim, dtype=torch.float64), dst=0)
    w = torch.from_numpy(w)
    dist.broadcast(w, src=0)
    return w.numpy()
""",
    ),
    shortcut(
        "fedavg_over_ranks",
        "each client sends back the model it received, untrained",
        """\
def fedavg_over_ranks(rank, world_size, bench):
    w = torch.zeros(bench.dim, dtype=torch.float64)
    for chosen in bench.participants():
        if rank == 0:
            for k in chosen:
                dist.send(w, dst=k + 1)
            models = []
            for k in chosen:
                model = torch.empty(bench.dim, dtype=torch.float64)
                dist.recv(model, src=k + 1)
                models.append(model.numpy())
            sizes = [bench.client_sizes[k] for k in chosen]
            w = torch.from_numpy(np.average(models, axis=0, weights=sizes))
        elif rank - 1 in chosen:
            dist.recv(w, src=0)
            dist.send(w, dst=0)
    dist.broadcast(w, src=0)
    return w.numpy()
""",
    ),
    bug(
        "fedavg_over_ranks",
        "the server sends zeros: every round starts from the first model",
        "                dist.send(w, dst=k + 1)",
        "                dist.send(torch.zeros_like(w), dst=k + 1)",
    ),
    shortcut(
        "fedavg_over_ranks",
        "the weighted sum by an all-reduce through the process group's own method, no model sent",
        """\
def fedavg_over_ranks(rank, world_size, bench):
    group = dist.distributed_c10d._get_default_group()
    w = torch.zeros(bench.dim, dtype=torch.float64)
    if rank > 0:
        X, y = bench.client_data(rank - 1)
        rng = bench.client_rng(rank - 1)
    for chosen in bench.participants():
        share = torch.zeros(bench.dim, dtype=torch.float64)
        if rank > 0 and rank - 1 in chosen:
            local = w.numpy().copy()
            for _ in range(bench.steps_of(rank - 1)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            total = sum(bench.client_sizes[k] for k in chosen)
            share = torch.from_numpy(local * bench.client_sizes[rank - 1] / total)
        group.allreduce([share]).wait()
        w = share
    dist.broadcast(w, src=0)
    return w.numpy()
""",
    ),
    # --- masked_update -----------------------------------------------------------------
    bug(
        "masked_update",
        "both clients of a pair add the mask (the masks do not cancel)",
        "            masked -= federated.pair_mask",
        "            masked += federated.pair_mask",
    ),
    bug(
        "masked_update",
        "signs swapped: subtract the masks with higher clients, add those with lower",
        """\
        if client == i:
            masked += federated.pair_mask(seed, len(masked), scale=mask_scale)
        elif client == j:
            masked -= federated.pair_mask(seed, len(masked), scale=mask_scale)""",
        """\
        if client == i:
            masked -= federated.pair_mask(seed, len(masked), scale=mask_scale)
        elif client == j:
            masked += federated.pair_mask(seed, len(masked), scale=mask_scale)""",
    ),
    shortcut(
        "masked_update",
        "masks made from the client's index: they cancel, but anyone can remove them",
        """\
def masked_update(update, client, pair_seeds, *, mask_scale):
    n = 1 + max((j for _, j in pair_seeds), default=0)
    return np.asarray(update, dtype=float) + mask_scale * (n - 1 - 2 * client)
""",
    ),
    shortcut(
        "masked_update",
        "every client derives every client's mask from all the seeds (zero-sum noise)",
        """\
def masked_update(update, client, pair_seeds, *, mask_scale):
    update = np.asarray(update, dtype=float)
    n = 1 + max((j for _, j in pair_seeds), default=0)
    rng = np.random.default_rng(sorted(pair_seeds.values()))
    masks = mask_scale * rng.standard_normal((n, len(update)))
    return update + masks[client] - masks.mean(axis=0)
""",
    ),
    # --- secure_sum --------------------------------------------------------------------
    bug(
        "secure_sum",
        "the unmatched mask removed with the wrong sign",
        """\
        if i in masked:  # survivor i added m_ij; j never sent its -m_ij
            total = total - mask""",
        """\
        if i in masked:  # survivor i added m_ij; j never sent its -m_ij
            total = total + mask""",
    ),
    bug(
        "secure_sum",
        "masks removed for pairs of two dropped clients as well",
        "        if (i in masked) == (j in masked):",
        "        if i in masked and j in masked:",
    ),
    shortcut(
        "secure_sum",
        "every survivor unmasked with all its seeds (the survivors' secrets used)",
        """\
def secure_sum(masked, pair_seeds, *, mask_scale):
    total = 0.0
    for k, vector in masked.items():
        update = np.array(vector, dtype=float)
        for (i, j), seed in pair_seeds.items():
            if k == i:
                update -= federated.pair_mask(seed, len(update), scale=mask_scale)
            elif k == j:
                update += federated.pair_mask(seed, len(update), scale=mask_scale)
        total = total + update
    return total
""",
    ),
    shortcut(
        "secure_sum",
        "the visible test's sums looked up by who reported",
        """\
def secure_sum(masked, pair_seeds, *, mask_scale):
    table = {(0, 1, 2): [12.0, 15.0, 18.0], (0, 1): [5.0, 7.0, 9.0], (1, 2): [11.0, 13.0, 15.0]}
    return np.array(table.get(tuple(sorted(masked)), [0.0, 0.0, 0.0]))
""",
    ),
    # --- private_mean ------------------------------------------------------------------
    bug(
        "private_mean",
        "noise std sigma, not scaled by the clip norm (the sensitivity)",
        "rng.normal(0.0, noise_multiplier * clip_norm, updates.shape[1])",
        "rng.normal(0.0, noise_multiplier, updates.shape[1])",
    ),
    bug(
        "private_mean",
        "noise added to the mean instead of the sum",
        "return (clipped.sum(axis=0) + noise) / len(updates)",
        "return clipped.sum(axis=0) / len(updates) + noise",
    ),
    bug(
        "private_mean",
        "each coordinate clipped to [-S, S] instead of the update's norm",
        "clipped = updates * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))",
        "clipped = np.clip(updates, -clip_norm, clip_norm)",
        hint=(
            "each coordinate clipped to [-S, S]: clipping bounds the update's norm, so scale the "
            "whole update by min(1, S / its norm)"
        ),
    ),
    bug(
        "private_mean",
        "every update scaled to norm S, the small ones scaled up",
        "clipped = updates * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))",
        "clipped = updates * (clip_norm / np.maximum(norms, 1e-300))",
        hint=(
            "every update scaled to norm S, the small ones scaled up as well: clipping only "
            "scales down, by min(1, S / norm)"
        ),
    ),
    shortcut(
        "private_mean",
        "the package's answer held in a default argument",
        """\
def private_mean(updates, *, clip_norm, noise_multiplier, rng, _f=federated.dp_mean):
    return _f(np.asarray(updates, dtype=float), clip_norm=clip_norm,
              noise_multiplier=noise_multiplier, rng=rng)
""",
    ),
    shortcut(
        "private_mean",
        "the visible cases looked up",
        """\
def private_mean(updates, *, clip_norm, noise_multiplier, rng):
    updates = np.asarray(updates, dtype=float)
    if noise_multiplier > 0:
        return np.array([0.3, 0.4]) + rng.normal(0.0, 1.0, 2)
    return np.array([0.3, 0.4]) if clip_norm < 5 else updates.mean(axis=0)
""",
    ),
    # --- issue 53, item 3: messages the recorder does not see
    shortcut(
        "fedavg_over_ranks",
        "the models sent and received by the process group's own methods, unseen",
        """\
def fedavg_over_ranks(rank, world_size, bench):
    group = dist.group.WORLD
    w = torch.zeros(bench.dim, dtype=torch.float64)
    if rank > 0:
        client = rank - 1
        X, y = bench.client_data(client)
        rng = bench.client_rng(client)
    for chosen in bench.participants():
        if rank == 0:
            for k in chosen:
                group.send([w], k + 1, 0).wait()
            models = []
            for k in chosen:
                model = torch.empty(bench.dim, dtype=torch.float64)
                group.recv([model], k + 1, 0).wait()
                models.append(model.numpy())
            sizes = [bench.client_sizes[k] for k in chosen]
            w = torch.from_numpy(np.average(models, axis=0, weights=sizes))
        elif client in chosen:
            group.recv([w], 0, 0).wait()
            local = w.numpy().copy()
            for _ in range(bench.steps_of(client)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            group.send([torch.from_numpy(local)], 0, 0).wait()
    dist.broadcast(w, src=0)
    return w.numpy()
""",
    ),
    shortcut(
        "fedavg",
        "the minibatches drawn by the package's private _minibatch",
        """\
def fedavg(problem, local_steps, *, rounds=30, lr=0.1, batch_size=32):
    sizes = [len(y) for _, y in problem.clients]
    w = np.zeros(problem.dim)
    for _ in range(rounds):
        models = []
        for X, y in problem.clients:
            local = w.copy()
            for _ in range(local_steps):
                idx = federated._minibatch(problem.rng, len(y), batch_size)
                local -= lr * logistic_grad(local, X[idx], y[idx])
            models.append(local)
        w = np.average(models, axis=0, weights=sizes)
    return w
""",
    ),
]
