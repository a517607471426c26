"""Seeded toy problems and tiny models that the sections train again and again.

Kind: data and models. Rule: every problem is built from a seed and gives the same numbers on
every run; a problem cut across ranks hands each rank only its own part (its shard, its rows,
its stage), and the unsplit run that a check compares with is computed outside the rank.
"""
