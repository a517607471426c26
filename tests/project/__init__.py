"""Tests of distopt.project: section 07's training project."""
