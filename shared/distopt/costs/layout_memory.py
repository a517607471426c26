"""Memory of one GPU in a tensor x pipeline x data parallel layout, by part.

:func:`parallel_training_breakdown` applies section 02's models (:mod:`distopt.costs.memory`:
training state, activations after Korthikanti et al. 2022, float32 logits, ZeRO-3's gathered
layer) to the share of one GPU: 1/(t p) of the parameters, the activations of its pipeline
stage's micro-batches in flight under 1F1B (:func:`stage_activation_bytes`), the logits on the
last stage only, tensor parallelism and sequence parallelism as Korthikanti et al. count them.
"""

from __future__ import annotations

from distopt.costs import memory


def stage_activation_bytes(
    stored_per_layer: float,
    working_per_layer: float,
    *,
    num_layers: int,
    pipeline_parallel: int = 1,
    micro_batches: int = 1,
    stage: int = 0,
) -> float:
    """Activation bytes on a GPU of pipeline stage ``stage`` (0 = first) at its peak.

    Each of the p = ``pipeline_parallel`` stages runs ``num_layers / p`` layers; under 1F1B,
    stage i has min(p - i, m) of the m = ``micro_batches`` in flight, each storing
    ``stored_per_layer`` in every layer of the stage, except the layer being processed,
    which holds ``working_per_layer``. With p = 1: (L - 1) stored + 1 working.
    """
    if pipeline_parallel < 1 or num_layers % pipeline_parallel:
        raise ValueError(
            f"pipeline_parallel must be >= 1 and divide num_layers ({num_layers}), "
            f"got {pipeline_parallel!r}"
        )
    if not 0 <= stage < pipeline_parallel:
        raise ValueError(f"stage must be in [0, {pipeline_parallel}), got {stage!r}")
    if int(micro_batches) != micro_batches or micro_batches < 1:
        raise ValueError(f"micro_batches must be a whole number >= 1, got {micro_batches!r}")
    in_flight = min(pipeline_parallel - stage, micro_batches)
    layers = in_flight * num_layers // pipeline_parallel
    return (layers - 1) * stored_per_layer + working_per_layer


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
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Peak bytes on a GPU of pipeline stage ``stage`` under t x p x d parallelism, by part.

    * ``weights``, ``gradients``, ``optimizer``: ``memory.training_state_breakdown`` of the
      GPU's 1/(t p) of the parameters, ZeRO-sharded over the d = ``data_parallel`` replicas;
    * ``activations``: :func:`stage_activation_bytes` of ``memory.activation_bytes_per_layer``
      (with t and ``sequence_parallel``);
    * ``logits``: on the last stage only, ``memory.logits_bytes`` split over the t ranks (the
      output layer is vocabulary-parallel);
    * ``gathered``: under ZeRO-3, the layer in use with its gradient, 12 h^2 / t parameters.

    With t = p = 1 the parts add up to ``memory.peak_training_breakdown``; the activations
    differ from :func:`distopt.costs.planner.memory_per_gpu` under full recomputation by the
    one stored layer input that the layer being processed replaces here.
    """
    t, p = tensor_parallel, pipeline_parallel
    if t < 1 or heads % t:
        raise ValueError(f"tensor_parallel must be >= 1 and divide heads ({heads}), got {t!r}")
    parts = memory.training_state_breakdown(
        num_params / (t * p),
        zero_stage=zero_stage,
        world_size=data_parallel,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
    )

    def per_layer(mode: str) -> float:
        return memory.activation_bytes_per_layer(
            seq_len, micro_batch, hidden, heads, tensor_parallel=t,
            sequence_parallel=sequence_parallel, recompute=mode,
        )  # fmt: skip

    parts["activations"] = stage_activation_bytes(
        per_layer(recompute), per_layer("none"), num_layers=num_layers,
        pipeline_parallel=p, micro_batches=micro_batches, stage=stage,
    )  # fmt: skip
    last = stage == p - 1
    parts["logits"] = memory.logits_bytes(seq_len, micro_batch, vocab) / t if last else 0.0
    gathered = 12 * hidden**2 / t * (weight_bytes + grad_bytes)
    parts["gathered"] = gathered if zero_stage == 3 else 0.0
    return parts
