"""Tests of distopt.costs: the closed-form cost models."""
