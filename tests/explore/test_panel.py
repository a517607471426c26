"""The explorers' shared machinery: a panel draws on a control's move, an Answer falls back."""

import ipywidgets as widgets
import pytest
from matplotlib.figure import Figure

from distopt.explore import Answer, Panel, View
from distopt.explore.panel import PROMPT


def _square(x):
    return x * x


def _panel(answer=None):
    def view(settings):
        x = settings["x"]
        if x < 0:
            raise ValueError("x must be at least 0")
        value = answer(x) if answer else _square(x)
        fig = Figure()
        fig.add_subplot().plot([0, x], [0, value])
        return View([f"x = {x}", f"x^2 = {value}"], fig)

    control = widgets.BoundedIntText(value=3, min=-5, max=10, description="x")
    return Panel("toy", "A toy", {"x": control}, view, answers=(answer,) if answer else ())


def test_a_panel_does_nothing_until_a_control_moves():
    panel = _panel()
    assert PROMPT in panel.readout.value and panel.last is None
    panel.controls["x"].value = 4  # what a student's move does: the observer draws
    assert panel.last.lines == ["x = 4", "x^2 = 16"]
    assert "x^2 = 16" in panel.readout.value


def test_the_draw_button_draws_the_current_settings():
    panel = _panel()
    panel.button.click()
    assert panel.last.lines == ["x = 3", "x^2 = 9"]


def test_a_setting_the_model_rejects_is_explained_not_raised():
    panel = _panel()
    panel.controls["x"].value = 2
    panel.controls["x"].value = -1
    assert "cannot be drawn: x must be at least 0" in panel.readout.value
    assert panel.last.lines == ["x = 2", "x^2 = 4"]  # the last good view stays


def test_every_piece_has_the_class_the_browser_tests_look_for():
    panel = _panel()
    assert "distopt-explorer-toy" in panel.widget._dom_classes
    assert "distopt-control-x" in panel.controls["x"]._dom_classes
    for piece, name in [(panel.button, "draw"), (panel.note, "note"),
                        (panel.readout, "readout"), (panel.figure, "figure")]:  # fmt: skip
        assert f"distopt-{name}" in piece._dom_classes


def _blank(x):
    raise NotImplementedError


def _buggy(x):
    raise TypeError("unsupported operand")


def _wrong(x):
    return x * 2


@pytest.mark.parametrize(
    ("student", "shown", "note"),
    [
        (None, 9, "the package's square"),
        (_blank, 9, "your square is still blank: the package's square"),
        (_buggy, 9, "your square raised TypeError: unsupported operand; the package's square"),
        (_wrong, 6, "your square"),  # a wrong answer is shown as it is: the student sees it
    ],
)
def test_an_answer_uses_the_students_function_or_says_why_not(student, shown, note):
    answer = Answer("square", student, _square, "square")
    panel = _panel(answer)
    panel.button.click()
    assert panel.last.lines[-1] == f"x^2 = {shown}"
    assert panel.note.value == f"computed with {note}"


def test_a_panel_needs_a_control():
    with pytest.raises(ValueError, match="at least one control"):
        Panel("empty", "Empty", {}, lambda s: View([]))
