"""Tests of distopt.sim: the numpy simulations of the distributed algorithms."""
