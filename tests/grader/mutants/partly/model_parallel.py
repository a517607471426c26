"""Partly right answers of section 03 (model parallelism): each passes every visible check of
its exercise and fails a hidden case only (see heldout.py's ``partly``)."""

from tests.grader.mutants import bug
from tests.grader.mutants.heldout import partly

PARTLY = [
    # --- Exercise 1: megatron_mlp_rank -------------------------------------------------------
    # Both visible blocks have hidden size 8; the student reshapes the input to rows of 8.
    partly(
        bug(
            "megatron_mlp_rank",
            "the input viewed as rows of 8 values, the visible block's width",
            "x = shard.x.clone().requires_grad_()",
            "x = shard.x.clone().view(-1, 8).requires_grad_()",
        )
    ),
    # --- Exercise 2: best_tensor_degree ------------------------------------------------------
    # No visible state fills the memory exactly; a hidden one does (state = memory, t = 1).
    partly(
        bug(
            "best_tensor_degree",
            "a share equal to the memory counted as not fitting",
            "if heads % t or state_bytes / t > memory_bytes:",
            "if heads % t or state_bytes / t >= memory_bytes:",
        )
    ),
    # --- Exercise 3: bubble_fraction_formula -------------------------------------------------
    # The visible cases have interleave 1; integer division rounds (p - 1) / v down to 0 or 1.
    partly(
        bug(
            "bubble_fraction_formula",
            "the idle slots divided by the interleave with //",
            "idle = (stages - 1) / interleave",
            "idle = (stages - 1) // interleave",
        )
    ),
    # --- Exercise 4: max_in_flight_formula ---------------------------------------------------
    # GPipe is checked on stage 0 only in sight; later stages hold all m too.
    partly(
        bug(
            "max_in_flight_formula",
            "GPipe: a later stage thought to hold fewer micro-batches, m - stage",
            'if schedule == "gpipe":\n        return micro_batches\n',
            'if schedule == "gpipe":\n        return micro_batches - stage\n',
        )
    ),
    # --- Exercise 5: gpipe_stage -------------------------------------------------------------
    # Written by role (the first stage feeds, the last one computes the loss): right for two
    # stages or more, wrong for a one-stage pipeline, whose only stage is first and last: its
    # output goes backward unreduced, not as the loss.
    partly(
        bug(
            "gpipe_stage",
            "the loss computed on the last stage only if it is not also the first",
            "        if last:  # the micro-batch's share",
            "        if last and not first:  # the first stage only feeds the pipeline; share",
        )
    ),
    # --- Exercise 6: all_to_all_counts -------------------------------------------------------
    # Both visible routers are top-2 with 2 experts per device: k taken for experts per device.
    partly(
        bug(
            "all_to_all_counts",
            "experts per device taken as k, the experts a token picks",
            "experts_per_device = num_experts // world_size",
            "experts_per_device = chosen_experts.shape[1]",
        )
    ),
    # --- Exercise 7: dropped_copies_at -------------------------------------------------------
    # Every visible capacity is a whole number (or 165 plus float noise); round() agrees there.
    partly(
        bug(
            "dropped_copies_at",
            "the capacity rounded to the nearest whole number, not up",
            "capacity = math.ceil(round(capacity_factor * tokens * k / num_experts, 9))",
            "capacity = round(capacity_factor * tokens * k / num_experts)",
        )
    ),
    # --- Exercise 8: load_balancing_loss -----------------------------------------------------
    # The visible logits are small; scaled by 1,000 a row far below the batch's largest score
    # underflows to 0 / 0.
    partly(
        bug(
            "load_balancing_loss",
            "the softmax stabilised by the batch's largest score, not each row's",
            "weights = np.exp(logits - logits.max(axis=1, keepdims=True))",
            "weights = np.exp(logits - logits.max())",
        )
    ),
    # --- Exercise 9: expert_parallel_moe -----------------------------------------------------
    # Every visible layer has tokens of width 4; the hidden width-3 layer does not fit.
    partly(
        bug(
            "expert_parallel_moe",
            "the rows received allocated 4 wide, the visible tokens' width",
            "received = rows.new_empty((sum(recv_counts), rows.shape[1]))",
            "received = rows.new_empty((sum(recv_counts), 4))",
        )
    ),
    # --- Exercise 10: ring_attention_blocks --------------------------------------------------
    # The visible ring's queries are 4 wide: the scale typed as 1 / sqrt(4).
    partly(
        bug(
            "ring_attention_blocks",
            "the scale 1 / sqrt(d) typed for the visible width d = 4",
            "scale = 1 / math.sqrt(q.shape[1])",
            "scale = 0.5  # 1 / sqrt(d)",
        )
    ),
    # --- Exercise 11: ring_attention_rank ----------------------------------------------------
    # The visible causal ring is zig-zag (two chunks per rank); a causal contiguous layout
    # holds one chunk per rank, which this answer cuts in two.
    partly(
        bug(
            "ring_attention_rank",
            "a causal rank assumed to hold two zig-zag chunks: half its rows per chunk",
            "length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])",
            "length = len(q) // 2 if shard.causal else len(q)  # zig-zag: two chunks\n"
            "    scale = 1 / math.sqrt(q.shape[1])",
        )
    ),
    # --- Exercise 12: choose_layout ----------------------------------------------------------
    # The visible step times differ by more than 10 ms, or not at all; two hidden cases
    # differ by 1.2 and 2.2 ms, which this answer calls a tie.
    partly(
        bug(
            "choose_layout",
            "step times within 10 ms counted as a tie, decided by the traffic",
            "        if theirs != mine:\n",
            '        if criterion == "time" and abs(theirs - mine) < 0.01:\n'
            "            continue  # within 10 ms: as fast\n"
            "        if theirs != mine:\n",
        )
    ),
    # --- Exercise 13: servers_for_deadline ---------------------------------------------------
    # The visible clusters keep the H100's datasheet peak; the cluster rebuilt field by field
    # loses a hidden cluster's own peak, and only the MFU is wrong.
    partly(
        bug(
            "servers_for_deadline",
            "the cluster rebuilt field by field: its peak FLOP/s left at the default",
            "sized = dataclasses.replace(cluster, num_gpus=servers * cluster.gpus_per_server)",
            "sized = planner.ClusterSpec(\n"
            "            num_gpus=servers * cluster.gpus_per_server,\n"
            "            gpus_per_server=cluster.gpus_per_server,\n"
            "            memory_bytes=cluster.memory_bytes,\n"
            "            intra_bandwidth=cluster.intra_bandwidth,\n"
            "            inter_bandwidth=cluster.inter_bandwidth, flops_per_s=cluster.flops_per_s)",
        )
    ),
]
