"""Seeded toy problems and tiny models, one of each, that the sections train again and again.

``logistic`` (logistic regression: data, loss, gradient, minimum), ``least_squares``,
``classify`` (a teacher-labelled classification task and its training loops),
``stacked_runs`` (many seeded runs of that task at once), ``mlp`` (the
one seeded MLP builder), ``megatron_mlp``, ``pipeline_stack`` and ``moe_layer`` (a model cut
by tensor, pipeline and expert parallelism: each rank's part, the unsplit run),
``sequence_chunks`` (attention's inputs cut into chunks held by ranks, and full attention),
``corpus`` (a Markov language with an exact entropy rate), ``checkpointing`` (a transformer
block, the bytes autograd saves for it, and which blocks to checkpoint).
"""
