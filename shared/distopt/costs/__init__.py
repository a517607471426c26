"""Closed-form cost models: what communication, memory, compute and bubbles cost.

Formulas only (no randomness), each cited to its paper: ``comm`` (alpha-beta costs
of collectives, ZeRO traffic), ``memory`` (training state, activations, the FSDP step),
``buckets`` (DDP's bucketed all-reduce against the backward pass), ``prefetch`` (FSDP's
prefetched gathers against layer compute), ``transformer`` (parameter
and FLOP counts), ``bubbles`` (the pipeline bubble), ``critical_batch`` (the critical batch
size model and the noise scale), ``tensor_layer`` (a tensor-parallel layer's compute against
its all-reduces), ``planner`` (ranking tensor x pipeline x data layouts by
these models), ``privacy`` (the epsilon of DP-FedAvg from Opacus's RDP accountant; the only
module here that imports torch, through opacus).
"""
