"""Memory of one GPU in a tensor x pipeline x data parallel layout, by part, in 02's arguments.

A thin layer over :func:`distopt.costs.memory.gpu_memory_stage` (the course's one memory
model) for callers that describe the model by six numbers.
:func:`parallel_training_breakdown` applies section 02's models (:mod:`distopt.costs.memory`:
training state, activations after Korthikanti et al. 2022, float32 logits, ZeRO-3's gathered
layer) to the share of one GPU: 1/(t p) of the parameters, the activations of its pipeline
stage's micro-batches in flight under 1F1B (:func:`stage_activation_bytes`), the logits on the
last stage only, tensor parallelism and sequence parallelism as Korthikanti et al. count them.
"""

from __future__ import annotations

from distopt.costs import memory
from distopt.costs.shape import Layout, TransformerShape

stage_activation_bytes = memory.stage_activation_bytes


def parallel_training_breakdown(
    num_params: float,
    num_layers: int,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    *,
    zero_stage: int,
    data_parallel: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    micro_batches: int = 1,
    stage: int = 0,
    vocab: int = 32_000,
    flash_attention: bool = False,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Peak bytes on a GPU of pipeline stage ``stage`` under t x p x d parallelism, by part:
    ``memory.gpu_memory_stage`` of a GPT-style shape of ``num_params`` parameters (naive
    attention unless ``flash_attention``).

    * ``weights``, ``gradients``, ``optimizer``: ``memory.training_state_breakdown`` of the
      GPU's 1/(t p) of the parameters, ZeRO-sharded over the d = ``data_parallel`` replicas;
    * ``activations``: :func:`stage_activation_bytes` of ``memory.layer_activation_bytes``
      (with t and ``sequence_parallel``);
    * ``logits``: on the last stage only, ``memory.logits_bytes`` split over the t ranks (the
      output layer is vocabulary-parallel);
    * ``gathered``: under ZeRO-3, the layer in use with its gradient, 12 h^2 / t parameters.

    With t = p = 1 the parts add up to ``memory.peak_training_breakdown``.
    """
    model = TransformerShape(num_layers, hidden, heads, vocab, seq_len, params=num_params)
    layout = Layout(
        tensor=tensor_parallel,
        pipeline=pipeline_parallel,
        data=data_parallel,
        zero_stage=zero_stage,
        micro_batch=micro_batch,
        recompute=recompute,
        flash_attention=flash_attention,
        sequence_parallel=sequence_parallel,
    )
    return memory.gpu_memory_stage(
        model,
        layout,
        micro_batches=micro_batches,
        stage=stage,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
    )
