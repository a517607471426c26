"""Section 07's training project: a small GPT trained with the lesson's recipe.

Kind: one end-to-end trainer. Rule: the notebook and the ``torchrun`` entry point run the same
loop, configuration and checkpoints, so a number the notebook prints is one that ``torchrun``
reproduces; the pieces it shares with other sections (schedules, AdamW groups) come from
:mod:`distopt.optim`.
"""
