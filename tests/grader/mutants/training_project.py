"""Mutants of section 07 (the training project): see tests/grader/mutants/__init__.py."""

from tests.grader.mutants import bug, shortcut

VARIANTS = [
    # --- width_for_params ----------------------------------------------------------------
    bug(
        "width_for_params",
        "the embeddings and biases left out of the linear term",
        "b = 13 * layers + vocab + seq_len",
        "b = 0",
        hint="the linear term (13 l + V + s: the embeddings and biases) left out of the count, "
        "as the 12 l h^2 rule of thumb does",
    ),
    bug(
        "width_for_params",
        "rounded down, not to the nearest multiple",
        "multiple * round(exact / multiple)",
        "multiple * math.floor(exact / multiple)",
    ),
    shortcut(
        "width_for_params",
        "the 12 l h^2 rule of thumb instead of the quadratic",
        """\
def width_for_params(num_params, layers, *, vocab, seq_len, multiple=128):
    return max(multiple, multiple * round(math.sqrt(num_params / (12 * layers)) / multiple))
""",
        hint="the linear term (13 l + V + s: the embeddings and biases) left out of the count, "
        "as the 12 l h^2 rule of thumb does",
    ),
    shortcut(
        "width_for_params",
        "the printed widths looked up",
        """\
def width_for_params(num_params, layers, *, vocab, seq_len, multiple=128):
    return {(1e9, 24): 1792, (125e6, 12): 768}.get((num_params, layers), multiple)
""",
    ),
    # --- training_days -------------------------------------------------------------------
    bug(
        "training_days",
        "2ND: the forward pass only",
        "flops = 6 * num_params * num_tokens",
        "flops = 2 * num_params * num_tokens",
    ),
    bug(
        "training_days",
        "the utilisation forgotten: the devices run at their peak",
        "seconds = flops / (num_devices * peak_flops_per_s * mfu)",
        "seconds = flops / (num_devices * peak_flops_per_s)",
    ),
    shortcut(
        "training_days",
        "6ND from the package's scaling.training_flops, held in a default argument",
        """\
from distopt.costs import scaling

def training_days(num_params, num_tokens, *, num_devices, peak_flops_per_s, mfu,
                  _flops=scaling.training_flops):
    return _flops(num_params, num_tokens) / (num_devices * peak_flops_per_s * mfu) / 86_400
""",
    ),
    shortcut(
        "training_days",
        "the visible cases looked up",
        """\
def training_days(num_params, num_tokens, *, num_devices, peak_flops_per_s, mfu):
    return 0.8694466702279203 if num_devices == 64 else 6.7199700174137735
""",
    ),
    # --- memory_per_device ---------------------------------------------------------------
    bug(
        "memory_per_device",
        "checkpointing without the recomputed layer's full activations",
        "activations = layers * stored + full_layer",
        "activations = layers * stored",
    ),
    bug(
        "memory_per_device",
        "the training state never sharded",
        "zero_stage=zero_stage,",
        "zero_stage=0,",
    ),
    shortcut(
        "memory_per_device",
        "the package's peak_training_breakdown, its logits and gathered layer dropped",
        """\
def memory_per_device(num_params, *, layers, hidden, heads, seq_len, micro_batch,
                      world_size, zero_stage, checkpointing):
    parts = memory.peak_training_breakdown(
        num_params, layers, seq_len, micro_batch, hidden, heads, zero_stage=zero_stage,
        world_size=world_size, recompute="full" if checkpointing else "none")
    stored = memory.activation_bytes_per_layer(seq_len, micro_batch, hidden, heads,
                                               recompute="full")
    return parts["state"] + parts["activations"] + (stored if checkpointing else 0.0)
""",
    ),
    shortcut(
        "memory_per_device",
        "the visible cases looked up",
        """\
def memory_per_device(num_params, *, layers, hidden, heads, seq_len, micro_batch,
                      world_size, zero_stage, checkpointing):
    return 5011140736.0 if checkpointing else 82590660208.0
""",
    ),
    # --- decay_groups --------------------------------------------------------------------
    bug(
        "decay_groups",
        "decay on the norms and biases too",
        "(decay if p.ndim >= 2 else no_decay).append(p)",
        "(decay if p.ndim >= 1 else no_decay).append(p)",
    ),
    bug(
        "decay_groups",
        "frozen parameters kept",
        """\
        if not p.requires_grad:
            continue
""",
        "",
    ),
    shortcut(
        "decay_groups",
        "the package's groups held in a default argument",
        """\
def decay_groups(model, weight_decay, _groups=recipe.adamw_param_groups):
    return _groups(model, weight_decay)
""",
    ),
    shortcut(
        "decay_groups",
        "decay the weights of Linear and Embedding modules (the visible block's kinds)",
        """\
def decay_groups(model, weight_decay):
    decayed = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0}]
""",
    ),
    # --- adamw_step ----------------------------------------------------------------------
    bug(
        "adamw_step",
        "an L2 penalty: the decay added to the gradient",
        "param = param * (1 - lr * weight_decay)\n",
        "grad = grad + weight_decay * param\n",
    ),
    bug(
        "adamw_step",
        "no bias correction",
        "m_hat = m / (1 - beta1**step)\n    v_hat = v / (1 - beta2**step)\n",
        "m_hat, v_hat = m, v\n",
    ),
    shortcut(
        "adamw_step",
        "torch.optim.AdamW run on a copy of the arrays",
        """\
def adamw_step(param, grad, m, v, step, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    p = torch.tensor(param, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": torch.tensor(m),
                    "exp_avg_sq": torch.tensor(v)}
    p.grad = torch.tensor(grad)
    opt.step()
    state = opt.state[p]
    return p.detach().numpy(), state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()
""",
    ),
    shortcut(
        "adamw_step",
        "torch's fused AdamW kernel (a C function) called on tensors of the arrays",
        """\
def adamw_step(param, grad, m, v, step, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    p, m, v = torch.tensor(param), torch.tensor(m), torch.tensor(v)
    torch._fused_adamw_([p], [torch.tensor(grad)], [m], [v], [], [torch.tensor(float(step))],
                        lr=lr, beta1=betas[0], beta2=betas[1], weight_decay=weight_decay,
                        eps=eps, amsgrad=False, maximize=False)
    return p.numpy(), m.numpy(), v.numpy()
""",
    ),
    shortcut(
        "adamw_step",
        "Adam's first step (decay, then lr times the sign) at every step",
        """\
def adamw_step(param, grad, m, v, step, *, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    return param * (1 - lr * weight_decay) - lr * np.sign(grad), m.copy(), v.copy()
""",
    ),
    # --- promote -------------------------------------------------------------------------
    bug(
        "promote",
        "nan not handled: sorted by the raw loss",
        "key=lambda i: (0, losses[i]) if math.isfinite(losses[i]) else (1, 0.0))",
        "key=lambda i: losses[i])",
    ),
    bug(
        "promote",
        "keeps len // eta rounded up",
        "keep = max(1, len(losses) // eta)",
        "keep = max(1, -(-len(losses) // eta))",
    ),
    shortcut(
        "promote",
        "the package's rule held in a default argument",
        """\
from distopt.project import hpsearch

def promote(losses, eta, _rule=hpsearch.promote):
    return _rule(losses, eta)
""",
        hint="the package's own promote (hpsearch.promote) called instead of your own code",
    ),
    shortcut(
        "promote",
        "a copy of the package's source run under another name",
        """\
import inspect

from distopt.project import hpsearch

_copy = {}
exec(inspect.getsource(hpsearch.promote).replace("def promote", "def my_promote"),
     vars(hpsearch), _copy)

def promote(losses, eta):
    return _copy["my_promote"](losses, eta)
""",
        hint="the package's own promote (hpsearch.promote) called instead of your own code",
    ),
    shortcut(
        "promote",
        "the visible cases looked up",
        """\
def promote(losses, eta):
    if eta < 2:
        raise ValueError("eta must be >= 2")
    return {6: [3, 1], 3: [2], 2: [1]}.get(len(losses), [0])
""",
    ),
    # --- model_flops_utilization ---------------------------------------------------------
    bug(
        "model_flops_utilization",
        "2N: forward FLOPs only",
        "per_token = 6 * weights + 3 * attention",
        "per_token = 2 * weights + attention",
    ),
    bug(
        "model_flops_utilization",
        "the read-out matrix d V forgotten",
        "weights = n_layer * 12 * d_model**2 + d_model * vocab_size",
        "weights = n_layer * 12 * d_model**2",
    ),
    shortcut(
        "model_flops_utilization",
        "the package's flops_per_token held in a default argument",
        """\
from distopt.project.gpt import GPTConfig, flops_per_token

def model_flops_utilization(tokens_per_s, *, n_layer, d_model, seq_len, vocab_size,
                            peak_flop_per_s, _f=flops_per_token):
    config = GPTConfig(vocab_size=vocab_size, seq_len=seq_len, n_layer=n_layer, n_head=1,
                       d_model=d_model)
    return tokens_per_s * _f(config) / peak_flop_per_s
""",
    ),
    shortcut(
        "model_flops_utilization",
        "the visible cases looked up",
        """\
def model_flops_utilization(tokens_per_s, *, n_layer, d_model, seq_len, vocab_size,
                            peak_flop_per_s):
    return 0.345 if d_model == 12288 else 90.0
""",
    ),
    # --- mup_learning_rates --------------------------------------------------------------
    bug(
        "mup_learning_rates",
        "the hidden rate not scaled with the width (SP)",
        '"hidden": base_lr / width_mult',
        '"hidden": base_lr',
    ),
    bug(
        "mup_learning_rates",
        "the hidden rate scaled the wrong way, times width / base_width",
        '"hidden": base_lr / width_mult',
        '"hidden": base_lr * width_mult',
    ),
    shortcut(
        "mup_learning_rates",
        "the rates read off the package's param_groups of a GPT built for the purpose",
        """\
from distopt.project import gpt as _gpt

def mup_learning_rates(base_lr, base_width, width, _groups=_gpt.param_groups):
    model = _gpt.GPT(_gpt.GPTConfig(vocab_size=4, seq_len=4, n_layer=1, n_head=1,
                                    d_model=width, mup_base_width=base_width))
    hidden = min(g["lr"] for g in _groups(model, lr=base_lr, weight_decay=0.0))
    return {"hidden": hidden, "embedding": base_lr, "readout": base_lr, "vector": base_lr,
            "logit_multiplier": base_width / width}
""",
    ),
    shortcut(
        "mup_learning_rates",
        "the printed dict for width 32 -> 128",
        """\
def mup_learning_rates(base_lr, base_width, width):
    return {"hidden": 0.0025, "embedding": 0.01, "readout": 0.01, "vector": 0.01,
            "logit_multiplier": 0.25}
""",
    ),
    # --- diagnose ------------------------------------------------------------------------
    bug(
        "diagnose",
        "nan and inf not checked",
        "    if not finite or end > 1.2 * start:",
        "    if end > 1.2 * start:",
    ),
    bug(
        "diagnose",
        "overfitting: the validation loss compared with its first value, not its minimum",
        "if val_end > 1.03 * val_loss[best] and end < train_at_best:",
        "if val_end > 1.03 * val_loss[0] and end < train_at_best:",
    ),
    shortcut(
        "diagnose",
        "the package's diagnose held in a default argument",
        """\
def diagnose(history, _f=distopt.project.diagnose.diagnose):
    return _f(history)
""",
    ),
    shortcut(
        "diagnose",
        "the test's curves regenerated from synthetic_history and looked up",
        """\
from distopt.project.diagnose import PROBLEMS, REQUIRED_KEYS, synthetic_history

def diagnose(history):
    for key in REQUIRED_KEYS:
        if key not in history:
            raise ValueError(f"history has no {key!r}")
    n = len(history["loss"])
    seen = [np.asarray(history[key], dtype=float) for key in ("loss", "val_loss", "step_time")]
    for steps in sorted({n, 60, 150, 300, 400, 1000, 2500}):
        if steps < max(n, 50):  # synthetic_history makes at least 50 steps
            continue
        for seed in range(10):
            for problem in PROBLEMS:
                other = synthetic_history(problem, steps=steps, seed=seed)
                if all(len(other[key]) == len(mine)
                       and np.allclose(other[key], mine, equal_nan=True)
                       for key, mine in zip(("loss", "val_loss", "step_time"), seen)):
                    return problem
    return "healthy"
""",
    ),
    # --- issue 53, item 6: the diagnose module's private helpers, and a CodeType.replace copy
    shortcut(
        "diagnose",
        "assembled from the package's private helpers (_diverged, _has_spike, ...)",
        """\
def diagnose(history):
    from distopt.project import diagnose as rules

    for key in rules.REQUIRED_KEYS:
        if key not in history:
            raise ValueError(f"history has no {key!r}")
    step, loss = np.asarray(history["step"], float), np.asarray(history["loss"], float)
    grad_norm = np.asarray(history["grad_norm"], float)
    val_step = np.asarray(history["val_step"], float)
    val_loss = np.asarray(history["val_loss"], float)
    if rules._diverged(loss, grad_norm, val_loss):
        return "divergence"
    fraction = rules._compute_fraction(history)
    if fraction is not None and fraction < rules.MIN_COMPUTE_FRACTION:
        return "slow_throughput"
    if rules._has_spike(loss):
        return "loss_spikes"
    if rules._overfitting(step, loss, val_step, val_loss):
        return "overfitting"
    w = rules._tenth(len(loss))
    start, end = np.median(loss[:w]), np.median(loss[-w:])
    return "plateau" if start - end < rules.PLATEAU_MAX_DROP * start else "healthy"
""",
    ),
    shortcut(
        "diagnose",
        "the package's diagnose under another name, line and docstring (CodeType.replace)",
        """\
import types

import distopt.project.diagnose as _rules

_code = _rules.diagnose.__code__
_code = _code.replace(co_name="diagnose", co_qualname="diagnose", co_firstlineno=1,
                      co_consts=(None, *_code.co_consts[1:]))
diagnose = types.FunctionType(_code, vars(_rules), "diagnose")
""",
    ),
]
