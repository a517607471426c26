"""Interactive explorers: move a control, and the package's models redraw the numbers and a figure.

Kind: notebook widgets over the cost models. Rule: each explorer is a plain function
``view(settings) -> View`` (the printed lines and a matplotlib figure for one setting, testable
without a browser) and a :class:`Panel` that puts controls in front of it and does no work until
a control moves, so a Run-All is not slowed. Where a section has an exercise for a quantity, the
panel computes it with the student's own function (an :class:`Answer`), falling back to the
package's, and says so.
"""

from distopt.explore.panel import Answer, Panel, View

__all__ = ["Answer", "Panel", "View"]
