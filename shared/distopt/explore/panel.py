"""The machinery every explorer shares: a view of one setting, the controls, the student's answer.

A :class:`Panel` lays out ipywidgets controls (each a ``ValueWidget`` under a settings key),
a Draw button, a note line (which function computed what), a readout (the view's lines, as
text) and a figure. Every piece carries a CSS class, so the browser tests find them:
``distopt-explorer-<name>`` on the whole panel, ``distopt-control-<key>`` on each control,
``distopt-draw``, ``distopt-note``, ``distopt-readout`` and ``distopt-figure``.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import Image, display
from matplotlib.figure import Figure

PROMPT = "Move a control, or press Draw."


@dataclass
class View:
    """What an explorer shows for one setting: lines of numbers and (optionally) a figure."""

    lines: list[str]
    figure: Figure | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Answer:
    """The student's function where it is answered, else the package's, and which one ran.

    ``student`` may be None (the notebook passes ``globals().get(name)``): the package's
    function is used. A blank exercise (``NotImplementedError``) or a student function that
    raises falls back to the package's; :meth:`note` says what happened at the last call.
    """

    name: str
    student: Callable | None
    package: Callable
    package_name: str
    used: str = field(default="", init=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.student is not None:
            try:
                value = self.student(*args, **kwargs)
            except NotImplementedError:
                self.used = f"your {self.name} is still blank: the package's {self.package_name}"
            except Exception as exc:  # a student's bug must not break the explorer
                self.used = (
                    f"your {self.name} raised {type(exc).__name__}: {str(exc)[:120]}; "
                    f"the package's {self.package_name}"
                )
            else:
                self.used = f"your {self.name}"
                return value
        elif not self.used:
            self.used = f"the package's {self.package_name}"
        return self.package(*args, **kwargs)

    def note(self) -> str:
        return self.used


class Panel:
    """ipywidgets controls in front of ``view``; draws on a control's change or on Draw."""

    def __init__(
        self,
        name: str,
        title: str,
        controls: Mapping[str, widgets.ValueWidget],
        view: Callable[[dict], View],
        *,
        answers: tuple[Answer, ...] = (),
    ):
        if not controls:
            raise ValueError("a panel needs at least one control")
        self.name, self.view, self.answers = name, view, answers
        self.controls = dict(controls)
        for key, control in self.controls.items():
            control.add_class(f"distopt-control-{key}")
            control.observe(self.draw, names="value")
        self.button = widgets.Button(description="Draw", button_style="primary")
        self.button.add_class("distopt-draw")
        self.button.on_click(self.draw)
        self.note = widgets.HTML("")
        self.note.add_class("distopt-note")
        self.readout = widgets.HTML(_pre(PROMPT))
        self.readout.add_class("distopt-readout")
        self.figure = widgets.Output()
        self.figure.add_class("distopt-figure")
        grid = widgets.GridBox(
            list(self.controls.values()),
            layout=widgets.Layout(grid_template_columns="repeat(auto-fill, minmax(340px, 1fr))"),
        )
        self.widget = widgets.VBox(
            [widgets.HTML(f"<b>{html.escape(title)}</b>"), grid, self.button, self.note,
             self.readout, self.figure]
        )  # fmt: skip
        self.widget.add_class(f"distopt-explorer-{name}")
        self.last: View | None = None

    def settings(self) -> dict:
        return {key: control.value for key, control in self.controls.items()}

    def draw(self, *_: Any) -> View | None:
        """Compute the view of the current settings and show it; a bad setting is explained."""
        for answer in self.answers:
            answer.used = ""
        try:
            shown = self.view(self.settings())
        except ValueError as exc:  # a combination the models reject: say why, keep the figure
            self.readout.value = _pre(f"These settings cannot be drawn: {exc}")
            return None
        self.note.value = "; ".join(
            html.escape(f"computed with {a.note()}", quote=False) for a in self.answers if a.note()
        )
        self.readout.value = _pre(shown.text)
        with self.figure:
            self.figure.clear_output(wait=True)
            if shown.figure is not None:
                display(Image(data=png(shown.figure), format="png"))
        self.last = shown
        return shown

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (shown as an image whatever the kernel's matplotlib backend)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)  # a pyplot figure would otherwise stay open (and show at the cell's end)
    return buffer.getvalue()


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text, quote=False)}</pre>"
