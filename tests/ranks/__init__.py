"""Tests of distopt.ranks: each section's rank code and checks on real torch.distributed ranks."""
