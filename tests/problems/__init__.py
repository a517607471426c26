"""Tests of distopt.problems: the seeded toy problems and tiny models."""
