"""The numbers the notebooks' lead-ins quote for each explorer are what the explorer computes.

Each lead-in tells the student what to try and what they will see; the explorer's output is
not stored (nbval ignores it), so these tests keep the text and the models in step.
"""

import re

import nbformat
import pytest

from distopt.explore import memory, pipeline, planner, privacy
from tests.helpers import ROOT


def _lead_in(notebook: str, module: str) -> str:
    """The markdown cell just above the cell that builds the explorer ``module``."""
    cells = nbformat.read(ROOT / "solutions" / notebook, as_version=4).cells
    (index,) = [
        i for i, c in enumerate(cells)
        if c.cell_type == "code" and f"from distopt.explore import {module} " in c.source + " "
    ]  # fmt: skip
    assert cells[index - 1].cell_type == "markdown"
    return " ".join(cells[index - 1].source.split())


def _number(text: str, label: str) -> float:
    """The first number after ``label`` in the readout ``text``."""
    match = re.search(re.escape(label) + r"[^0-9]*([0-9][0-9,]*\.?[0-9]*)", text)
    assert match, (label, text)
    return float(match.group(1).replace(",", ""))


def _view(module, **changes) -> str:
    return module.view({**module.DEFAULTS, **changes}).text


def test_memory():
    text = _lead_in("02_memory_sharding/memory_sharding.ipynb", "memory")
    start, full = _view(memory), _view(memory, recompute="full")
    assert f"{_number(start, 'total'):.1f} GB, {_number(start, 'does not fit by'):.1f} GB" in text
    assert f"`full`: {_number(full, 'total'):.1f} GB, and it fits" in text
    assert "fits," in full


def test_pipeline():
    text = _lead_in("03_model_parallel/model_parallel.ipynb", "pipeline")
    one_f_one_b, interleaved = _view(pipeline), _view(pipeline, schedule="interleaved")
    label = "idle (bubble) fraction, simulated:"
    assert f"from {_number(one_f_one_b, label):.2f}% to {_number(interleaved, label):.2f}%" in text
    zero_bubble = _view(pipeline, schedule="zb-h1")
    assert f"Pick ZB-H1: {_number(zero_bubble, label):.2f}% idle" in text
    assert "per device: 4, 4, 4, 4" in zero_bubble


@pytest.mark.parametrize(
    ("per_server", "quoted"), [(8, "6.746 s per step"), (4, "7.091 s per step")]
)
def test_planner(per_server, quoted):
    text = _lead_in("03_model_parallel/model_parallel.ipynb", "planner")
    shown = _view(planner, model="gpt3", global_batch=64, sharded_zero=False,
                  gpus_per_server=per_server)  # fmt: skip
    fastest = next(line for line in shown.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s", line))
    assert quoted in text and quoted.split()[0] in fastest.split(), fastest


def test_privacy():
    text = _lead_in("06_federated/federated.ipynb", "privacy")
    start, all_clients = _view(privacy), _view(privacy, clients_per_round=100)
    loud = _view(privacy, clients_per_round=100, noise_multiplier=22.5)
    # the loss quoted is the mean over the noise draws, the first number after "global loss"
    assert (
        f"{_number(start, 'global loss'):.3f} at $\\varepsilon = {_number(start, 'epsilon ='):.3f}"
        in text
    )
    assert f"drops to {_number(all_clients, 'global loss'):.3f}" in text
    assert f"rises to {_number(all_clients, 'epsilon ='):.3f}" in text
    assert f"(22.5 gives {_number(loud, 'epsilon ='):.3f})" in text
