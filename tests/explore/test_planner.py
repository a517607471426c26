"""The planner explorer: the planner's ranking, with memory and step time by part."""

import math

import pytest

from distopt.costs import bubbles, planner, transformer
from distopt.explore import planner as explore
from distopt.units import GB, H100_MEMORY_BYTES, gbit_per_s

ONE_B = planner.ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048)
GPT3 = planner.ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048)
CLUSTER = planner.ClusterSpec(64, 8, H100_MEMORY_BYTES, 450 * GB, gbit_per_s(400), 400e12)
GPT3_NOTEBOOK = {**explore.DEFAULTS, "model": "gpt3", "global_batch": 64, "sharded_zero": False}


def _rows(view):
    """The table's rows as lists of numbers (recompute as 1/0)."""
    start = next(i for i, line in enumerate(view.lines) if line.lstrip().startswith("t "))
    rows = []
    for line in view.lines[start + 1 : start + 1 + explore.ROWS]:
        cells = line.replace("|", " ").replace("yes", "1").replace("no", "0").replace("%", "")
        cells = cells.split()
        rows.append([float(cell) for cell in cells])
    return rows


def test_the_presets_are_the_notebooks_models():
    assert explore.MODELS["1b"][1] == ONE_B and explore.MODELS["gpt3"][1] == GPT3


def test_the_lessons_1b_model_on_64_gpus():
    shown = explore.view(explore.DEFAULTS)
    ranked = planner.plan(ONE_B, CLUSTER, 512)
    count = len(list(planner.layouts(ONE_B, CLUSTER, 512)))
    fit = f"{count} layouts divide the GPUs and the batch; {len(ranked)} fit in 90% of 85.9 GB"
    assert fit in shown.text
    rows = _rows(shown)
    assert len(rows) == explore.ROWS
    for row, (layout, peak, seconds) in zip(rows, ranked[: explore.ROWS], strict=True):
        assert row[:6] == [layout.tensor, layout.pipeline, layout.data, layout.zero_stage,
                           layout.micro_batch, layout.recompute == "full"]  # fmt: skip
        assert math.isclose(row[6], peak / GB, abs_tol=0.05)
        assert math.isclose(row[9], seconds, abs_tol=5e-4)
        assert math.isclose(row[10], 100 * planner.mfu(ONE_B, CLUSTER, 512, seconds), abs_tol=0.05)
    # the best: plain data parallelism, ZeRO-1, micro-batch 4; all compute, 6 N D FLOPs-ish
    assert rows[0][:6] == [1, 1, 64, 1, 4, 0]
    flops = transformer.training_flops(512, 2048, 24, 2048, 50304, recompute=False)
    assert math.isclose(rows[0][11], flops / (64 * 400e12), abs_tol=5e-4)
    assert rows[0][12:] == [0, 0, 0, 0, 0, 0]
    # all compute: the MFU is the sustained rate over the peak, 400 / 989
    assert math.isclose(rows[0][10], 100 * 400 / 989, abs_tol=0.05)


def test_gpt3_needs_tensor_and_pipeline_parallelism():
    rows = _rows(explore.view(GPT3_NOTEBOOK))
    t, p, d, _, b, recompute, *_, compute, bubble, tensor, context, expert, pipe, data = rows[0]
    assert (t, p, d, b, recompute) == (8, 4, 2, 1, 0)
    # two pipelines, 32 micro-batches of 1 each: the bubble is (p - 1) / m = 3/32 of the compute
    assert math.isclose(bubble, compute * bubbles.bubble_overhead(4, 32), abs_tol=2e-3)
    assert tensor > 0 and pipe > 0 and 0 < data < bubble and context == expert == 0
    assert all(row[1] == 1 or row[3] < 2 for row in rows), "ZeRO-2/3 only without a pipeline"


def test_the_figure_stacks_seven_parts_per_layout():
    shown = explore.view(explore.DEFAULTS)
    ax = shown.figure.axes[0]
    assert len(ax.patches) == 7 * explore.ROWS
    assert [label.get_text() for label in ax.get_yticklabels()][0] == "t1 p1 d64 ZeRO-1 b4"


def test_sharded_zero_and_slow_links_change_the_plan():
    allowed = _rows(explore.view({**GPT3_NOTEBOOK, "sharded_zero": True}))
    assert any(row[3] == 3 for row in allowed)
    slow = _rows(explore.view({**GPT3_NOTEBOOK, "inter_bandwidth": gbit_per_s(200)}))
    fast = _rows(explore.view(GPT3_NOTEBOOK))
    assert slow[0][9] > fast[0][9]


def test_nothing_fits_says_how_far_off():
    shown = explore.view({**explore.DEFAULTS, "model": "gpt3", "num_gpus": 8})
    assert "0 fit in 90% of 85.9 GB" in shown.text and "the smallest needs" in shown.text
    assert shown.figure is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_gpus": 12}, "whole servers"),
        ({"global_batch": 0}, "global_batch must be a positive int"),
        ({"model": "llama"}, "model must be one of"),
    ],
)
def test_settings_the_planner_rejects_are_explained(change, message):
    with pytest.raises(ValueError, match=message):
        explore.view({**explore.DEFAULTS, **change})


def test_the_panel_starts_at_the_defaults_and_redraws_on_a_move():
    panel = explore.explorer()
    assert panel.settings() == explore.DEFAULTS and panel.last is None
    panel.controls["model"].value = "gpt3"
    assert panel.last.lines == explore.view({**explore.DEFAULTS, "model": "gpt3"}).lines
