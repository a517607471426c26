"""Interactive explorers: move a control, and the package's models redraw the numbers and a figure.

Each explorer is two things:

* a plain function ``view(settings) -> View`` (the printed lines and a matplotlib figure for
  one setting of the controls), testable without a browser and called by the browser tests to
  know what the page must show;
* a :class:`Panel` that puts ipywidgets controls in front of it. A panel does no work when it
  is built (a Run-All is not slowed): it draws when a control moves or Draw is pressed.

Where the section has an exercise for a quantity, the panel computes it with the student's own
function, wrapped in an :class:`Answer`: a blank exercise (``NotImplementedError``) or one that
raises falls back to the package's function, and the panel says so.

Modules: ``panel`` (this machinery), ``memory`` (section 02), ``pipeline`` and ``planner``
(section 03), ``privacy`` (section 06).
"""

from distopt.explore.panel import Answer, Panel, View

__all__ = ["Answer", "Panel", "View"]
