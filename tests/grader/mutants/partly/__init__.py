"""Partly right answers, one module per notebook (``PARTLY``, a list of
:func:`tests.grader.mutants.heldout.partly`): right for the visible cases, wrong for a hidden
one, written as students write them. Never learned from (see heldout.py)."""
