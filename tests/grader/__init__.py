"""Tests of the autograder: grading, the hostile catalogue, mutants, release and self-check."""
