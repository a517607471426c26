"""Tests of distopt.engine: the launcher, fork server and recorder on real CPU processes."""
