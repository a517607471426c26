"""Partly right answers of section 07 (the training project): each passes every visible check
of its exercise and fails a hidden case only (see heldout.py's ``partly``). None of them is a
catalogued mistake written again, so the right diagnosis of each is nothing."""

from tests.grader.mutants import bug
from tests.grader.mutants.heldout import partly

PARTLY = [
    # --- Exercise A.1: width_for_params ------------------------------------------------------
    # The visible cases' s (2,048 and 1,024) is small against V = 50,304: leaving out the
    # position embeddings does not move their widths; s = 8,192 with V = 256 does.
    partly(
        bug(
            "width_for_params",
            "the position embeddings s h left out of the linear term",
            "b = 13 * layers + vocab + seq_len",
            "b = 13 * layers + vocab  # the embedding matrix",
        )
    ),
    # The visible floor case uses the default multiple, 128; the hidden ones multiples of 8, 64.
    partly(
        bug(
            "width_for_params",
            "never below 128, whatever the multiple",
            "return max(multiple, multiple * round(exact / multiple))",
            "return max(128, multiple * round(exact / multiple))",
        )
    ),
    # --- Exercise A.2: training_days ---------------------------------------------------------
    # The visible utilisations are 0.4 and 0.5; the hidden ones reach 0.7.
    partly(
        bug(
            "training_days",
            "the utilisation capped at 55 %, the best the lesson says real runs reach",
            "seconds = flops / (num_devices * peak_flops_per_s * mfu)",
            "mfu = min(mfu, 0.55)  # well-tuned large runs reach 40-55 %\n"
            "    seconds = flops / (num_devices * peak_flops_per_s * mfu)",
        )
    ),
    # --- Exercise A.4: memory_per_device -----------------------------------------------------
    # The visible cases are ZeRO-2 and FSDP; ZeRO-1 (4 + 12/N bytes per parameter) is hidden.
    partly(
        bug(
            "memory_per_device",
            "the training state by hand for ZeRO-2 and FSDP only: ZeRO-1 left unsharded",
            "    state = memory.training_state_bytes(num_params, zero_stage=zero_stage,\n"
            "                                        world_size=world_size)\n",
            "    if zero_stage >= 3:  # FSDP: weights, gradients and optimizer state sharded\n"
            "        state = 16 * num_params / world_size\n"
            "    elif zero_stage == 2:  # the 2-byte weights replicated, the rest sharded\n"
            "        state = num_params * (2 + 14 / world_size)\n"
            "    else:\n"
            "        state = 16 * num_params\n",
        )
    ),
    # --- Exercise A.5a: decay_groups ---------------------------------------------------------
    # The visible block's matrices are all two-dimensional; the hidden models have Conv1d
    # kernels (three dimensions) and LayerNorms named by their index in an nn.Sequential.
    partly(
        bug(
            "decay_groups",
            "decay on exactly two-dimensional parameters: the convolutions' kernels left out",
            "(decay if p.ndim >= 2 else no_decay).append(p)",
            "(decay if p.ndim == 2 else no_decay).append(p)",
        )
    ),
    partly(
        bug(
            "decay_groups",
            "decay by name: every '...weight' but the norms' (named 'norm' in the visible block)",
            "    for p in model.parameters():\n"
            "        if not p.requires_grad:\n"
            "            continue\n"
            "        (decay if p.ndim >= 2 else no_decay).append(p)\n",
            "    for name, p in model.named_parameters():\n"
            "        if not p.requires_grad:\n"
            "            continue\n"
            '        if name.endswith("weight") and "norm" not in name:\n'
            "            decay.append(p)\n"
            "        else:\n"
            "            no_decay.append(p)\n",
        )
    ),
    # --- Exercise A.5b: adamw_step -----------------------------------------------------------
    # Both visible runs use eps = 1e-8; the hidden ones 1e-6 and 1e-3 too.
    partly(
        bug(
            "adamw_step",
            "eps written as the constant 1e-8, the argument ignored",
            "return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v",
            "return param - lr * m_hat / (np.sqrt(v_hat) + 1e-8), m, v",
        )
    ),
    # --- Exercise B.2: promote ---------------------------------------------------------------
    # The visible cases never pass eta < 2.
    partly(
        bug(
            "promote",
            "eta < 2 never rejected",
            '    if eta < 2:\n        raise ValueError(f"eta must be >= 2, got {eta}")\n',
            "",
        )
    ),
    # The visible diverged run is a single nan; inf sorts after every finite loss by itself,
    # so only a nan before an inf, both kept, shows that inf is not ranked with the nan.
    partly(
        bug(
            "promote",
            "only nan put last: inf ranked as a number, after every finite loss but before nan",
            "key=lambda i: (0, losses[i]) if math.isfinite(losses[i]) else (1, 0.0))",
            "key=lambda i: (math.isnan(losses[i]), losses[i]))",
        )
    ),
    # --- Exercise B.4: model_flops_utilization -----------------------------------------------
    # The visible GPT-3 case is checked to 1 % against 0.345 and the other is 90 exactly.
    partly(
        bug(
            "model_flops_utilization",
            "rounded to 3 decimals, as the lesson prints it",
            "return tokens_per_s * per_token / peak_flop_per_s",
            "return round(tokens_per_s * per_token / peak_flop_per_s, 3)",
        )
    ),
    # --- Exercise B.5: mup_learning_rates ----------------------------------------------------
    # The visible widths 32 -> 128 divide evenly; the hidden ones do not, or shrink.
    partly(
        bug(
            "mup_learning_rates",
            "the width ratio by integer division",
            "width_mult = width / base_width",
            "width_mult = width // base_width",
        )
    ),
    # --- Exercise C.6: diagnose --------------------------------------------------------------
    # The visible slow run logs compute_time; a hidden one logs only comm_time.
    partly(
        bug(
            "diagnose",
            "without compute_time the rule is skipped: step_time - comm_time never used",
            '    elif "comm_time" in history:\n'
            '        compute = wall - np.sum(history["comm_time"])\n',
            "",
        )
    ),
]
