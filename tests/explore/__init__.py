"""Tests of distopt.explore: a package, so that its test_memory.py and test_planner.py
do not clash with those of tests/costs/ when pytest collects both."""
