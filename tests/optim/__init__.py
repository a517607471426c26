"""Tests of distopt.optim: the optimizers, schedules and stability tools."""
