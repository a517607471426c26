"""Mutants of section 04 (optimizers for very large batches): see mutants/__init__.py."""

from tests.grader.mutants import bug, shortcut

VARIANTS = [
    # --- Exercise 1: linear_scaled_lr ---------------------------------------------------------
    bug(
        "linear_scaled_lr",
        "ratio inverted: base_batch / batch_size",
        "return base_lr * batch_size / base_batch",
        "return base_lr * base_batch / batch_size",
    ),
    bug(
        "linear_scaled_lr",
        "square-root rule (Adam's) instead of the linear one",
        "return base_lr * batch_size / base_batch",
        "return base_lr * math.sqrt(batch_size / base_batch)",
    ),
    shortcut(
        "linear_scaled_lr",
        "the package's rule held in a default argument",
        """\
def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256, _rule=schedules.linear_scaled_lr):
    return _rule(batch_size, base_lr=base_lr, base_batch=base_batch)
""",
    ),
    shortcut(
        "linear_scaled_lr",
        "the visible cases looked up",
        """\
def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256):
    return {256: 0.1, 8192: 3.2, 64: 0.2}[batch_size]
""",
    ),
    # --- Exercise 2: warmup_cosine_lr ---------------------------------------------------------
    bug(
        "warmup_cosine_lr",
        "warm-up off by one: step / warmup_steps starts at 0",
        "return peak_lr * (step + 1) / warmup_steps",
        "return peak_lr * step / warmup_steps",
    ),
    bug(
        "warmup_cosine_lr",
        "cosine decays to 0, final_lr ignored",
        "return final_lr + (peak_lr - final_lr) * (1 + math.cos(math.pi * progress)) / 2",
        "return peak_lr * (1 + math.cos(math.pi * progress)) / 2",
    ),
    shortcut(
        "warmup_cosine_lr",
        "the package's schedule in a functools.partial",
        """\
import functools

warmup_cosine_lr = functools.partial(schedules.warmup_cosine_lr)
""",
    ),
    shortcut(
        "warmup_cosine_lr",
        "the visible cases looked up",
        """\
def warmup_cosine_lr(step, *, peak_lr, warmup_steps, total_steps, final_lr=0.0):
    if step >= total_steps:
        return final_lr
    return {0: 0.1, 9: 1.0, 10: 1.0, 60: 0.55 if final_lr else 0.5}[step]
""",
    ),
    # --- Exercise 3: lars_step ----------------------------------------------------------------
    bug(
        "lars_step",
        "weight decay left out of the trust ratio's denominator",
        "denominator = np.linalg.norm(g) + weight_decay * w_norm",
        "denominator = np.linalg.norm(g)",
    ),
    bug(
        "lars_step",
        "trust ratio inverted: ||g|| / ||w||",
        "ratio = w_norm / denominator if",
        "ratio = denominator / w_norm if",
    ),
    shortcut(
        "lars_step",
        "the package's LARS update held in a default argument",
        """\
def lars_step(w, g, velocity, *, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
              _update=optimizers.lars_update_):
    p, v = torch.tensor(w, dtype=torch.float64), torch.tensor(velocity, dtype=torch.float64)
    _update(p, torch.tensor(g, dtype=torch.float64), v, lr=lr, momentum=momentum,
            weight_decay=weight_decay, trust_coefficient=trust_coefficient)
    return p.numpy(), v.numpy()
""",
    ),
    shortcut(
        "lars_step",
        "the printed example's numbers",
        """\
def lars_step(w, g, velocity, *, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001):
    return np.array([2.97, 3.96]), np.array([0.03, 0.04])
""",
    ),
    # --- Exercise 4: lamb_step ----------------------------------------------------------------
    bug(
        "lamb_step",
        "no bias correction of the moments",
        "update = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * w",
        "update = m / (np.sqrt(v) + eps) + weight_decay * w",
    ),
    bug(
        "lamb_step",
        "trust ratio inverted: ||u|| / ||w||",
        "ratio = w_norm / u_norm if",
        "ratio = u_norm / w_norm if",
    ),
    shortcut(
        "lamb_step",
        "the package's LAMB optimizer held in a dict",
        """\
_PACKAGE = {"LAMB": optimizers.LAMB}


def lamb_step(w, g, m, v, step, *, lr, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
    p = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
    opt = _PACKAGE["LAMB"]([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    state = opt.state[p]
    for key, value in (("exp_avg", m), ("exp_avg_sq", v)):
        state[key] = torch.tensor(value, dtype=torch.float64)
    state["step"] = step - 1
    p.grad = torch.tensor(g, dtype=torch.float64)
    opt.step()
    return p.detach().numpy(), state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()
""",
    ),
    shortcut(
        "lamb_step",
        "the printed example's numbers",
        """\
def lamb_step(w, g, m, v, step, *, lr, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
    return (np.array([2.9646, 4.0354]), np.array([0.06, -0.08]), np.array([0.00036, 0.00064]))
""",
    ),
    # --- Exercise 5: clip_by_global_norm ------------------------------------------------------
    bug(
        "clip_by_global_norm",
        "each layer clipped by its own norm",
        """\
    total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))
    scale = max_norm / total if total > max_norm else 1.0
    return [g * scale for g in grads], total
""",
        """\
    total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))
    clipped = []
    for g in grads:
        norm = float(np.linalg.norm(g))
        clipped.append(g * (max_norm / norm if norm > max_norm else 1.0))
    return clipped, total
""",
    ),
    bug(
        "clip_by_global_norm",
        "the global norm without the square root",
        "total = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads))",
        "total = sum(float(np.sum(np.square(g))) for g in grads)",
    ),
    shortcut(
        "clip_by_global_norm",
        "torch's clip_grad_norm_ held in a default argument",
        """\
def clip_by_global_norm(grads, max_norm, _clip=torch.nn.utils.clip_grad_norm_):
    if max_norm <= 0:
        raise ValueError("max_norm must be positive")
    params = [torch.nn.Parameter(torch.zeros(np.shape(g), dtype=torch.float64)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g, dtype=torch.float64)
    total = float(_clip(params, max_norm))
    return [p.grad.numpy() for p in params], total
""",
    ),
    shortcut(
        "clip_by_global_norm",
        "the printed example's numbers",
        """\
def clip_by_global_norm(grads, max_norm):
    if max_norm >= 5.0:
        return [np.array(g, dtype=float) for g in grads], 5.0
    return [np.array([0.6, 0.0]), np.array([0.0, 0.8])], 5.0
""",
    ),
    # --- issue 53, item 6: the optimizers module's trust ratio
    shortcut(
        "lars_step",
        "the package's trust_ratio for the local rate",
        """\
def lars_step(w, g, velocity, *, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001):
    import torch
    from distopt.optim import optimizers as package

    w_norm = np.linalg.norm(w)
    ratio = float(package.trust_ratio(torch.tensor(w_norm),
                                      torch.tensor(np.linalg.norm(g) + weight_decay * w_norm)))
    new_velocity = momentum * velocity + lr * trust_coefficient * ratio * (g + weight_decay * w)
    return w - new_velocity, new_velocity
""",
    ),
]
