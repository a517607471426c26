"""Closed-form cost models: what communication, memory, compute and pipeline bubbles cost.

Kind: formulas. Rule: a function here takes numbers and a shape and returns numbers, with no
randomness, no processes and no torch (the privacy accountant, which wraps Opacus, is the one
exception), and cites the paper or lesson line its formula comes from. A simulation that
checks a formula lives in :mod:`distopt.sim`; a measurement in :mod:`distopt.ranks`. A
transformer and a parallel layout are described once (``TransformerShape``, ``Layout``), and
every model reads them.
"""
