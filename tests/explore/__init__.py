"""Tests of distopt.explore: the interactive explorers."""
