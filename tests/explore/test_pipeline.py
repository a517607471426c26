"""The pipeline explorer: the simulated bubble beside the closed form, the activations in flight."""

import pytest

from distopt.explore import pipeline as explore
from distopt.sim import pipeline as sim

INTERLEAVED = {**explore.DEFAULTS, "schedule": "interleaved", "chunks": 2}


def _line(view, start):
    return next(line for line in view.lines if line.startswith(start))


def test_the_lessons_charts_1f1b_4_stages_8_micro_batches():
    shown = explore.view(explore.DEFAULTS)
    # by hand: the step is m + p - 1 = 11 forward+backward lengths of 1 + 2 units, 8 of them work
    assert "step: 33 time units" in shown.lines[1] and "works 24" in shown.lines[1]
    assert _line(shown, "idle (bubble) fraction, simulated").endswith(f"{3 / 11:.2%}")
    assert f"{3 / 11:.2%}" in _line(shown, "closed form") and "37.50%" in shown.text  # 3 / 8
    assert "they agree" in shown.text
    # 1F1B: stage s holds p - s micro-batches
    assert _line(shown, "activations in flight").endswith("4, 3, 2, 1")
    assert "device 0 holds 4; the formula for stage 0 gives 4" in shown.lines


def test_interleaving_divides_the_bubble_and_holds_more():
    shown = explore.view(INTERLEAVED)
    idle = 1.5 / 9.5  # (p-1)/v = 1.5 idle lengths against m = 8 of work
    assert _line(shown, "idle (bubble) fraction, simulated").endswith(f"{idle:.2%}")
    assert "step: 28.5 time units" in shown.lines[1]
    # Korthikanti et al.: p + (p-1)/v stage units = 5.5, that is 11 chunks of half a stage
    assert _line(shown, "activations in flight").endswith("11, 9, 7, 5")
    assert "11 chunks of 1/2 stage = 5.5 stage units; 1F1B on the same pipeline holds 4" in (
        shown.text
    )


def test_gpipe_holds_every_micro_batch_and_the_ratio_leaves_the_bubble_alone():
    lines = {}
    for ratio in (1.0, 3.0):
        shown = explore.view({**explore.DEFAULTS, "schedule": "gpipe", "backward_ratio": ratio})
        lines[ratio] = _line(shown, "idle (bubble) fraction")
        assert _line(shown, "activations in flight").endswith("8, 8, 8, 8")
    assert lines[1.0] == lines[3.0]
    step = explore.view({**explore.DEFAULTS, "schedule": "gpipe", "backward_ratio": 1.0}).lines[1]
    assert "step: 22 time units" in step  # 11 lengths of 1 + 1


def test_the_chart_has_one_bar_per_task():
    shown = explore.view(INTERLEAVED)
    ax = shown.figure.axes[0]
    assert len(ax.patches) == 2 * 4 * 8 * 2
    assert len(ax.get_yticks()) == 4


def test_chunks_apply_to_the_interleaved_schedule_only():
    one = explore.view({**explore.DEFAULTS, "chunks": 4})
    assert one.lines == explore.view(explore.DEFAULTS).lines


def test_a_large_setting_is_computed_but_not_drawn():
    shown = explore.view(
        {**explore.DEFAULTS, "stages": 8, "micro_batches": 32, "schedule": "interleaved",
         "chunks": 4}
    )  # fmt: skip
    assert shown.figure is None and "this setting has 2048" in shown.lines[-1]
    tasks = sim.simulate("interleaved", 8, 32, interleave=4)
    assert f"{sim.idle_fraction(tasks):.2%}" in shown.text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schedule": "interleaved", "micro_batches": 6}, "multiple of the stages"),
        ({"schedule": "interleaved", "chunks": 1}, "v >= 2"),
        ({"schedule": "zigzag"}, "schedule must be one of"),
        ({"stages": 0}, "stages must be a positive int"),
        ({"backward_ratio": 0.0}, "ratio must be positive"),
    ],
)
def test_settings_the_simulator_rejects_are_explained(change, message):
    with pytest.raises(ValueError, match=message):
        explore.view({**explore.DEFAULTS, **change})


def test_the_panel_starts_at_the_defaults_and_redraws_on_a_move():
    panel = explore.explorer()
    assert panel.settings() == explore.DEFAULTS and panel.last is None
    assert panel.controls["chunks"].disabled
    panel.controls["schedule"].value = "interleaved"
    assert not panel.controls["chunks"].disabled
    assert panel.last.lines == explore.view(INTERLEAVED).lines
    assert panel.last.figure is not None


def test_a_blank_exercise_falls_back_to_the_package():
    def blank(*args, **kwargs):
        raise NotImplementedError

    panel = explore.explorer(bubble_fraction_formula=blank, max_in_flight_formula=blank)
    panel.button.click()
    assert panel.last.lines == explore.view(explore.DEFAULTS).lines
    assert "your bubble_fraction_formula is still blank" in panel.note.value
    assert "your max_in_flight_formula is still blank" in panel.note.value


def test_the_students_functions_are_used():
    def overhead(stages, micro_batches, interleave=1):  # a plausible slip: idle / ideal
        return (stages - 1) / (interleave * micro_batches)

    def in_flight(schedule, stages, micro_batches, stage):
        return micro_batches  # right for GPipe only

    panel = explore.explorer(bubble_fraction_formula=overhead, max_in_flight_formula=in_flight)
    panel.button.click()
    assert "37.50%" in _line(panel.last, "closed form")
    assert "they differ by 10.23%" in panel.last.text  # 37.50% against 27.27%
    assert "the formula for stage 0 gives 8 -- the simulator counts 4" in panel.last.text
    assert "your bubble_fraction_formula" in panel.note.value
    assert "your max_in_flight_formula" in panel.note.value
    assert "package" not in panel.note.value


def test_zero_bubble_h1_beside_its_closed_form_and_1f1b():
    shown = explore.view({**explore.DEFAULTS, "schedule": "zb-h1"})
    # p = 4, m = 8, F = 1, B = W = 1: idle (p-1)(1+1-1) = 3 against 8 x 3 of work
    assert _line(shown, "idle (bubble) fraction, simulated").endswith(f"{3 / 27:.2%}")
    assert _line(shown, "closed form").endswith(f"{3 / 27:.2%}")
    assert _line(shown, "1F1B on the same pipeline").startswith(
        f"1F1B on the same pipeline: {3 / 11:.2%}"
    )
    assert _line(shown, "activations in flight").endswith("4, 4, 4, 4")
    ax = shown.figure.axes[0]
    assert len(ax.patches) == 3 * 4 * 8  # F, B and W of every micro-batch on every device
    few = explore.view({**explore.DEFAULTS, "schedule": "zb-h1", "micro_batches": 2})
    assert "m >= p only" in _line(few, "closed form")
