"""Optimizers, schedules and what keeps training stable at scale.

Kind: single-process optimizer pieces that the sections and the training project share. Rule:
plain ``torch.optim`` conventions (an optimizer is a ``torch.optim.Optimizer``, a schedule a
function of the step), no process groups: the distributed versions are in :mod:`distopt.ranks`.
"""
