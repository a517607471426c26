"""Answers a person should read whatever they scored (issue 53, item 7): the static scan of
graded answer cells (autograder/integrity.py, ``needs_review``) names nothing in the seven
reference notebooks, and names each kind of line planted in a reference answer, with its
cell, line and words; the report lists them (autograder/report.py, ``review_list``).
test_hostile.py grades such an answer (the catalogue's ``needs-review``) end to end."""

from __future__ import annotations

import copy

import nbformat
import pytest

from autograder import course, integrity, outcomes, report

REFERENCES = sorted(course.SOLUTIONS.glob("0*/*.ipynb"))


def test_all_seven_reference_notebooks_are_scanned():
    assert len(REFERENCES) == 7, REFERENCES
    answers = [
        c
        for path in REFERENCES
        for c in nbformat.read(path, as_version=4).cells
        if course.is_answer(c)
    ]
    assert len(answers) > 30  # the scan has answers to read


@pytest.mark.parametrize("path", REFERENCES, ids=lambda p: p.parent.name)
def test_no_reference_answer_needs_review(path):
    nb = nbformat.read(path, as_version=4)
    assert integrity.needs_review(nb) is None


# One planted line per kind (and a second way of writing most), each added to a reference
# answer of section 02: (kind, the line).
PLANTED = [
    ("private", "whole = problem._batch_for(1 - rank)"),
    ("private", "whole = getattr(problem, '_whole_batch')()"),
    ("private", "everything = vars(problem)"),
    ("frames", "caller = sys._getframe(1).f_locals"),
    ("frames", "callers = inspect.stack()"),
    ("frames", "found = gc.get_referrers(model)"),
    ("processes", "subprocess.run(['python', '-c', 'print(1)'])"),
    ("processes", "os.system('true')"),
    ("processes", "worker = multiprocessing.Process(target=print)"),
    ("code", "fake = types.FunctionType(step.__code__.replace(co_name='x'), {})"),
    ("code", "exec('x = 1')"),
    ("hooks", "hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)"),
    ("recorder", "from distopt.engine import record"),
    ("recorder", "log = distopt.engine.record.communication()"),
    ("meter", "meter.report = lambda: 0"),
    ("meter", "peak = bench.meter.peak"),
]


def _planted(line: str) -> tuple[nbformat.NotebookNode, int, str]:
    """Section 02's reference with ``line`` opening its first answer cell."""
    nb = copy.deepcopy(nbformat.read(REFERENCES[1], as_version=4))
    index, cell = next((i, c) for i, c in enumerate(nb.cells) if course.is_answer(c))
    cell.source = line + "\n" + cell.source
    return nb, index, cell.metadata["nbgrader"]["grade_id"]


@pytest.mark.parametrize(
    ("kind", "line"), PLANTED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(PLANTED)]
)
def test_each_planted_kind_is_named_with_its_cell_and_line(kind, line):
    nb, index, grade_id = _planted(line)
    note = integrity.needs_review(nb)
    assert note is not None, line
    expected = f"cell {index + 1} ({grade_id}) line 1, {integrity.REVIEW_KINDS[kind]}: `{line}`"
    assert note == f"{integrity.REVIEW_WORDS}: {expected}", note


def test_own_private_attributes_and_the_parameters_are_not_reviews():
    source = (
        "class Mine:\n    def __init__(self):\n        self._cache = {}\n\n"
        "def step(model):\n    return [p for p in model.parameters()]\n"
    )
    assert integrity.review_lines(source) == []
    assert integrity.review_lines("def f(:\n    sys._getframe()") == []  # not Python: nothing


def test_many_lines_are_bounded_and_the_report_lists_them():
    lines = "\n".join(f"x{i} = problem._secret{i}" for i in range(20))
    nb, _, _ = _planted(lines)
    note = integrity.needs_review(nb)
    assert note.endswith("(and 15 more)"), note
    said = outcomes.Repaired(what=note).phrase()  # the reason column of grades.csv
    assert said.startswith(integrity.REVIEW_WORDS) and len(said) <= 900
    row = {"student_id": "alice", "section": "02", "score": "7", "max_score": "7"}
    section = report.review_list([{**row, "reason": f"every test passed; {said}"}])
    assert section[1] == "## Answers that need a person's review (1)"
    assert "- alice / 02 (7 / 7):" in section
    assert sum(item.startswith("  - cell ") for item in section) == 5, section
    assert report.review_list([{**row, "reason": "every test passed"}]) == []
