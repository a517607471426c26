"""Simulations of distributed algorithms in numpy: many "devices" in one process.

Kind: simulations. Rule: numpy only, seeded, one process; each is checked against a
single-process baseline or its closed form in :mod:`distopt.costs`, and is what a measured run
in :mod:`distopt.ranks` is compared with.
"""
