"""Closed-form cost models: what communication, memory, compute and bubbles cost.

Formulas only (no randomness), each cited to its paper: ``shape`` (the one description of a
transformer, ``TransformerShape``, and of a parallel layout, ``Layout``, that the models below
read), ``comm`` (alpha-beta costs of collectives, ZeRO traffic), ``memory`` (training state,
activations, the FSDP step, and ``gpu_memory``: the one memory model of a shape on one GPU of a
layout, which 02, 03's planner, 07 and the explorers call),
``buckets`` (DDP's bucketed all-reduce against the backward pass), ``prefetch`` (FSDP's
prefetched gathers against layer compute), ``transformer`` (parameter
and FLOP counts), ``bubbles`` (the pipeline bubble), ``critical_batch`` (the critical batch
size model and the noise scale), ``tensor_layer`` (a tensor-parallel layer's compute against
its all-reduces), ``planner`` (the bytes each kind of parallelism sends per GPU, and
tensor x context x pipeline x data layouts ranked by these models), ``privacy`` (the
epsilon of DP-FedAvg from Opacus's RDP accountant; the only module here that imports torch,
through opacus).
"""
