"""Section 07's training project: a small GPT trained with the lesson's recipe.

``gpt`` (the model, standard or muP, FLOPs per token), ``history`` (the training log),
``loop`` (the one training loop and its configuration), ``checkpoint`` (exact resume),
``train`` (the ``torchrun`` entry point), ``hpsearch`` (random search, successive halving,
width sweeps), ``diagnose`` (naming a problem from its curves).
"""
