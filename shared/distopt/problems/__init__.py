"""Seeded toy problems and tiny models, one of each, that the sections train again and again.

``logistic`` (logistic regression: data, loss, gradient, minimum), ``least_squares``,
``classify`` (a teacher-labelled classification task and its training loops), ``mlp`` (the
one seeded MLP builder), ``megatron_mlp`` and ``pipeline_stack`` (a model cut by tensor
and by pipeline parallelism: each rank's part, the unsplit run), ``corpus`` (a Markov
language with an exact entropy rate).
"""
