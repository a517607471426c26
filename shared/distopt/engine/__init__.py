"""The real engine's machinery: ``torch.distributed`` process groups on CPU processes.

Kind: machinery that starts, watches, records and times ranks, for any section. Rule: nothing
here knows a section's problem or answer; what the ranks of a section run, and the checks of a
student's rank code, live in :mod:`distopt.ranks`, and a module here never imports from there.
"""
