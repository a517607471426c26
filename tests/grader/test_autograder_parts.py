"""The autograder's parts without a kernel: repairs of submitted notebooks, the kernel's
fingerprint and its comparison, feedback pages that keep hidden tests hidden, the execute
step's records, the sandbox policy, and the gradebook's stamp and busy timeout.
Fast; the class runs in test_hostile.py and test_autograder.py show the same end to end."""

from __future__ import annotations

import copy
import json
import math
import shutil
import sqlite3
import subprocess
import sys
import threading

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_code_cell, new_notebook, new_output
from nbgrader.preprocessors import Execute
from traitlets.config import Config

from autograder import course, fingerprint, integrity, kernels, outcomes, sandbox, staging
from autograder.grading import Settings
from autograder.nbgrader_plugins import ExecuteUntilKernelDeath, HideHiddenTests
from autograder.results import words


def _graded(grade_id: str, source: str, *, test: bool, cell_id: str) -> nbformat.NotebookNode:
    meta = {"grade": test, "grade_id": grade_id, "solution": not test, "locked": test}
    if test:
        meta["points"] = 1
    cell = new_code_cell(source, metadata={"nbgrader": meta})
    cell["id"] = cell_id
    return cell


def _released() -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            _graded("f", "def f():\n    raise NotImplementedError()", test=False, cell_id="a1"),
            _graded("test_f", "assert f() == 1", test=True, cell_id="a2"),
            _graded("g", "def g():\n    raise NotImplementedError()", test=False, cell_id="a3"),
            _graded("test_g", "assert g() == 2", test=True, cell_id="a4"),
        ]
    )


def _ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_stripped_metadata_is_restored_by_cell_id():
    nb = copy.deepcopy(_released())
    for cell in nb.cells:
        cell.metadata.pop("nbgrader")
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", "g", "test_g"]
    assert notes == ["restored the nbgrader metadata of 4 cells"]


def test_duplicates_and_foreign_cells_lose_their_metadata():
    nb = copy.deepcopy(_released())
    nb.cells.insert(2, copy.deepcopy(nb.cells[1]))
    nb.cells[2]["id"] = "copy"
    nb.cells.append(_graded("test_other", "assert True", test=True, cell_id="zz"))
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", None, "g", "test_g", None]
    assert "cell 'test_f' appears twice: the first one is graded" in notes
    assert "cell 'test_other' is not part of this notebook: graded as ordinary code" in notes


def test_deleted_graded_cells_are_put_back_in_place():
    nb = copy.deepcopy(_released())
    del nb.cells[3]  # test_g
    del nb.cells[1]  # test_f
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", "g", "test_g"]
    assert notes == ["deleted graded cells put back: test_f (after cell 1), test_g (after cell 3)"]
    assert len({c["id"] for c in nb.cells}) == 4


def _with_demo_cells() -> nbformat.NotebookNode:
    """f, a demo cell defining what test_f uses, test_f; g, a demo cell, test_g."""
    nb = _released()
    for at, cell_id in ((1, "demo-f"), (4, "demo-g")):
        demo = new_code_cell(f"CONSTANT_{cell_id[-1]} = 1")
        demo["id"] = cell_id
        nb.cells.insert(at, demo)
    return nb


def test_a_deleted_test_goes_back_after_the_demo_cells_before_it():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") not in ("a2", "a4")]  # both tests deleted
    notes = staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells] == ["a1", "demo-f", "a2", "a3", "demo-g", "a4"]
    assert notes == ["deleted graded cells put back: test_f (after cell 2), test_g (after cell 5)"]


def test_the_anchor_is_the_nearest_earlier_cell_wherever_it_was_moved():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") != "a4"]
    demo_g = next(c for c in nb.cells if c.get("id") == "demo-g")
    nb.cells.remove(demo_g)
    nb.cells.insert(0, demo_g)  # the student moved the demo cell to the top
    staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells][:2] == ["demo-g", "a4"]


def test_with_no_earlier_cell_left_a_test_goes_before_the_next_one():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") != "a1"]  # the first cell, deleted
    notes = staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells] == ["a1", "demo-f", "a2", "a3", "demo-g", "a4"]
    assert notes == ["deleted graded cells put back: f (before cell 1)"]


def _fingerprint(**changes):
    fp = {
        "modules": {"numpy": 1},
        "ids": {"numpy.allclose": 10, "math.isclose": 11},
        "foreign": [],
        "hooks": {"custom_exceptions": "()"},
        "names": {"open": "shadows built-in:open"},
    }
    for key, value in changes.items():
        fp[key] = {**fp[key], **value} if isinstance(fp[key], dict) else value
    return fp


def test_the_integrity_comparison_names_each_change():
    base, seen = _fingerprint(), {}
    assert integrity.differences(base, _fingerprint(), seen, set()) == []
    assert integrity.differences(base, _fingerprint(ids={"numpy.allclose": 99}), seen, set()) == [
        "numpy.allclose was replaced"
    ]
    hooked = _fingerprint(hooks={"custom_exceptions": "(<class 'BaseException'>,)"})
    assert integrity.differences(base, hooked, seen, set()) == [
        "the kernel's custom_exceptions was changed"
    ]
    assert integrity.differences(base, None, seen, set()) == [
        "the integrity check got no answer from the kernel"
    ]


def test_a_rebound_module_name_is_tampering_but_plain_data_is_not():
    base, seen = _fingerprint(), {}
    integrity.differences(base, _fingerprint(names={"math": "module:math"}), seen, set())
    assert seen == {"math": "math"}
    fake = _fingerprint(names={"math": "object:"})
    assert integrity.differences(base, fake, seen, set()) == [
        "the name 'math' no longer refers to the module math"
    ]
    assert integrity.differences(base, _fingerprint(names={"math": None}), seen, set()) == []


def test_shadowing_a_builtin_matters_only_where_tests_use_it():
    base, seen = _fingerprint(), {}
    mine = _fingerprint(names={"filter": "shadows built-in:filter"})
    assert integrity.differences(base, mine, seen, {"assert", "f"}) == []
    assert integrity.differences(base, mine, seen, {"filter"}) != []
    err = _fingerprint(names={"AssertionError": "shadows built-in:AssertionError"})
    assert integrity.differences(base, err, seen, set()) != []


def _error(line: int, evalue: str) -> nbformat.NotebookNode:
    return new_output(
        "error",
        ename="AssertionError",
        evalue=evalue,
        traceback=[
            "\x1b[0;31mAssertionError\x1b[0m Traceback",
            f"Cell \x1b[0;32mIn[5], line {line}\x1b[0m\n  assert f() == 1\n  assert f(2) == 4",
            f"\x1b[0;31mAssertionError\x1b[0m: {evalue}",
        ],
    )


TEST_SOURCE = (
    "assert f() == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 4, 'secret case'\n### END HIDDEN TESTS"
)


def _feedback(line: int, printed: str = "") -> nbformat.NotebookNode:
    test = _graded("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(line, "secret case" if line > 1 else "")]
    student = new_code_cell("print(In)")
    student.outputs = [new_output("stream", name="stdout", text=printed)]
    nb = new_notebook(cells=[test, student])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    return nb


def test_a_hidden_failure_shows_only_that_a_hidden_test_failed():
    nb = _feedback(line=3, printed="['', \"assert f(2) == 4, 'secret case'\"]")
    test, student = nb.cells
    assert "secret" not in test.source and "f(2)" not in test.source
    assert test.source.startswith("assert f() == 1\n# (hidden tests)")
    assert [o.evalue for o in test.outputs] == ["hidden test failed"]
    assert "secret" not in student.outputs[0].text and "[hidden]" in student.outputs[0].text


def test_a_visible_failure_keeps_its_error_without_the_hidden_lines_around_it():
    nb = _feedback(line=1)
    (output,) = nb.cells[0].outputs
    assert output.ename == "AssertionError"
    assert output.evalue == "(line 1 of the test)"
    assert "f(2)" not in "".join(output.traceback)


def test_a_failure_recorded_by_the_autograder_is_shown_even_in_hidden_tests():
    test = _graded("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(3, "secret case")]
    outcomes.record(test, outcomes.Tampered(cell=1, when="before", changes=("x was replaced",)))
    nb, _ = HideHiddenTests().preprocess(new_notebook(cells=[test]), {})
    assert [o.ename for o in nb.cells[0].outputs] == ["HiddenTestFailed", "IntegrityError"]


# --- the kernel's fingerprint, taken here with a stand-in for IPython's shell -------------


class _Shell:
    """What fingerprint() reads of IPython's shell."""

    def __init__(self):
        self.input_transformers_cleanup, self.input_transformers_post = [], []
        self.ast_transformers, self.custom_exceptions = [], ()
        self.user_ns = {"np": math, "x": 1.5}

    def run_cell(self, source):
        return source


def _take(shell):
    return json.loads(fingerprint.fingerprint(shell))


def test_the_fingerprint_sees_patched_modules_shadowed_builtins_and_hooks(monkeypatch):
    shell = _Shell()
    base, seen = _take(shell), {}
    assert integrity.differences(base, _take(shell), seen, {"all"}) == []
    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    shell.user_ns["all"] = lambda items: True
    shell.run_cell = lambda source: None
    shell.custom_exceptions = (BaseException,)
    assert integrity.differences(base, _take(shell), seen, {"all"}) == [
        "math.isclose was replaced",
        "the kernel's custom_exceptions was changed",
        "the kernel's shell.run_cell was changed",
        "the notebook's name 'all' is a function shadowing the built-in",
    ]


def test_the_request_sends_the_fingerprint_module_itself():
    shell = _Shell()
    code, expression = integrity.fingerprint_request()
    assert code == ""
    assert integrity.FINGERPRINT_SOURCE == open(fingerprint.__file__, encoding="utf-8").read()
    # The kernel evaluates the expression in its namespace: here, one with only get_ipython.
    answer = eval(expression, {"get_ipython": lambda: shell})
    reply = {"user_expressions": {"fp": {"status": "ok", "data": {"text/plain": repr(answer)}}}}
    assert integrity.parse_reply(reply) == _take(shell)
    assert integrity.parse_reply({"user_expressions": {"fp": {"status": "error"}}}) is None


# --- the execute step's records, with nbclient's execution replaced ------------------------


def _executed(monkeypatch, raised: BaseException):
    """Two code cells run by the execute step, the first one's execution raising."""

    def execute(self, cell, resources, index):
        if index == 0:
            raise raised
        return cell, resources

    monkeypatch.setattr(Execute, "preprocess_cell", execute)
    nb = new_notebook(
        cells=[new_code_cell("f()"), _graded("test_f", "f()", test=True, cell_id="t")]
    )
    nb.cells[0].metadata[outcomes.METADATA_KEY] = {"outcomes": [{"outcome": "Repaired"}]}
    step = ExecuteUntilKernelDeath(check_integrity=0)
    step.start_notebook(nb)
    for index, cell in enumerate(nb.cells):
        step.preprocess_cell(cell, {}, index)
    return [outcomes.recorded(cell) for cell in nb.cells], nb


def test_a_kernel_lost_while_running_a_cell_fails_the_cells_after_it(monkeypatch):
    (first, second), nb = _executed(monkeypatch, ConnectionError("channel closed"))
    assert first == [outcomes.KernelLost(cell=1, cause="ConnectionError: channel closed")]
    assert second == [outcomes.NotRun(cell=2, grade_id="test_f", after=1)]
    assert [o.ename for o in nb.cells[1].outputs] == ["NotRun"]  # so nbgrader scores it 0
    ended_in = [outcomes.Graded(notebook="nb"), *first, *second]
    assert words(ended_in)[0] == "error: kernel lost in cell 1"


def test_a_dead_kernel_is_recorded_as_a_death(monkeypatch):
    (first, _), nb = _executed(monkeypatch, DeadKernelError("Kernel died"))
    assert [type(o) for o in first] == [outcomes.KernelDied]
    assert nb.cells[0].outputs[-1].ename == "KernelDied"


def test_a_timeout_is_recorded_and_its_error_output_is_the_records():
    step = ExecuteUntilKernelDeath(check_integrity=0, interrupt_on_timeout=False)
    cell = new_code_cell("while True: pass")
    step.start_notebook(new_notebook(cells=[cell]))
    step._place = {"cell": 1, "grade_id": None}
    from jupyter_core.utils import run_sync

    with pytest.raises(CellTimeoutError):
        run_sync(step._async_handle_timeout)(10, cell)
    (timed_out,) = outcomes.recorded(cell)
    assert timed_out == outcomes.CellTimeout(cell=1, limit_s=10)
    assert step.error_on_timeout["evalue"] == timed_out.output()["evalue"]


# --- the sandbox policy, travelling as configuration -----------------------------------------


def test_the_policy_hides_the_course_and_shows_the_environment(tmp_path):
    workdir = tmp_path / "autograded" / "alice" / "02"
    policy = sandbox.policy_for(workdir, course.ROOT)
    assert str(course.ROOT.resolve()) in policy.hidden_roots
    assert str(course.ROOT.resolve() / "shared") in policy.visible  # distopt, read-only
    assert str(sandbox.Path(sys.prefix).resolve()) in policy.visible
    assert policy.workdir == str(workdir)
    assert sandbox.Policy.from_json(policy.to_json()) == policy


def test_the_policy_hides_more_folders_when_told(tmp_path):
    socket_folder = tmp_path / "pg-socket"
    socket_folder.mkdir()
    gone = tmp_path / "no-such-folder"
    policy = sandbox.policy_for(tmp_path / "w", course.ROOT, also_hidden=[socket_folder, gone])
    assert str(socket_folder.resolve()) in policy.hidden_roots
    assert str(gone) not in policy.hidden_roots


def test_an_environment_reached_through_a_link_stays_visible(tmp_path, monkeypatch):
    """The kernel starts as <course>/.venv/bin/python when .venv links to a shared
    environment: that path must survive the tmpfs laid over the course root."""
    linked = tmp_path / "course" / ".venv"
    linked.parent.mkdir()
    linked.symlink_to(sandbox.Path(sys.prefix).resolve(), target_is_directory=True)
    monkeypatch.setattr(sys, "prefix", str(linked))
    monkeypatch.setattr(sys, "executable", str(linked / "bin" / "python"))
    policy = sandbox.policy_for(tmp_path / "work", tmp_path / "course")
    assert str(linked) in policy.visible  # the path the kernel is started by
    assert str(linked.resolve()) in policy.visible  # and the environment itself


def test_the_kernel_manager_takes_its_policy_from_the_configuration(tmp_path):
    policy = sandbox.policy_for(tmp_path / "work", course.ROOT)
    config = Config()
    config.SandboxedKernelManager.policy = policy.to_json()
    config.SandboxedKernelManager.runtime_dir = str(tmp_path / "run")
    km = kernels.SandboxedKernelManager(config=config)
    assert km.transport == "ipc"  # a kernel in its own network namespace: unix sockets
    assert km.connection_file.startswith(str(tmp_path / "run"))
    plain = kernels.SandboxedKernelManager(config=Config())
    assert plain.transport == "tcp"
    config.SandboxedKernelManager.policy = '{"workdir": 1}'
    with pytest.raises(ValueError, match="is not a Policy"):
        kernels.SandboxedKernelManager(config=config)


def test_the_wrapped_kernel_starts_in_the_namespaces_with_the_policy():
    policy = sandbox.Policy(hidden_roots=["/c"], visible=["/env"], workdir="/c/w", uid=200_001)
    command = sandbox.wrap(["python", "-m", "ipykernel_launcher"], policy)
    assert command[1:3] == ["--pdeathsig", "KILL"] and command[3].endswith("unshare")
    assert "--net" in command and "--pid" in command
    separator = command.index("--")
    assert sandbox.Policy.from_json(command[separator - 1]) == policy
    assert command[separator + 1 :] == ["python", "-m", "ipykernel_launcher"]


# --- the gradebook's busy timeout --------------------------------------------------------------


@pytest.fixture(scope="module")
def empty_gradebook(tmp_path_factory):
    """A new gradebook, made once."""
    db = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with course.open_gradebook(course.gradebook_url(db)):
        pass
    return db


def test_a_new_gradebook_is_stamped_as_the_alembic_program_would(tmp_path, monkeypatch):
    """The grader stamps new gradebooks without running `alembic` (course.stamp_in_process),
    with the revision the program names."""
    from nbgrader import api, dbutil

    with dbutil._temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        heads = subprocess.run(
            ["alembic", "-c", ini, "heads"], env=course.tool_env(), capture_output=True,
            text=True, check=True,
        )  # fmt: skip
    assert heads.stdout.split() == [course.alembic_head(), "(head)"]

    def no_program(*args, **kwargs):
        raise AssertionError(f"a program was run: {args}")

    monkeypatch.setattr(api.sp, "check_output", no_program)
    db = tmp_path / "gradebook.db"
    with course.open_gradebook(course.gradebook_url(db)):
        pass
    with sqlite3.connect(db) as stamped:
        assert stamped.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (course.alembic_head(),)
        ]


@pytest.fixture()
def gradebook_db(empty_gradebook, tmp_path):
    db = tmp_path / "gradebook.db"
    shutil.copy2(empty_gradebook, db)
    return db


def _write_while_locked(db, hold_s: float, busy_timeout_s: float) -> None:
    """Add a student to a gradebook while another connection holds its write lock."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(hold_s, holder.execute, ["COMMIT"])
    releaser.start()
    try:
        url = course.gradebook_url(db, busy_timeout_s=busy_timeout_s)
        with course.open_gradebook(url) as gb:
            gb.add_student("alice")
    finally:
        releaser.join()
        holder.close()


def test_a_locked_gradebook_is_waited_for(gradebook_db):
    _write_while_locked(gradebook_db, hold_s=1.0, busy_timeout_s=10)


def test_without_the_busy_timeout_a_locked_gradebook_fails(gradebook_db):
    """The control: the timeout in the URL is what makes the write above wait."""
    from nbgrader.api import InvalidEntry

    with pytest.raises(InvalidEntry, match="database is locked"):
        _write_while_locked(gradebook_db, hold_s=1.0, busy_timeout_s=0.05)


def test_the_course_gradebook_waits_long_enough():
    assert course.GRADEBOOK_URL.endswith(f"?timeout={course.GRADEBOOK_BUSY_TIMEOUT_S}")
    assert course.GRADEBOOK_BUSY_TIMEOUT_S >= 60


def test_a_sections_cell_timeout_applies_to_that_section_only():
    """A worker grades several sections: 99's own limit must not stick to the next one."""
    settings = Settings(cell_timeout_s={"99_catalogue": 20}, sandbox=True)
    assert settings.timeout_for("99_catalogue", 120) == 20
    assert settings.timeout_for("02_memory_sharding", 120) == 120
    everyone = Settings(cell_timeout_s={"*": 30, "99_catalogue": 20}, sandbox=True)
    assert everyone.timeout_for("02_memory_sharding", 120) == 30
    assert everyone.timeout_for("99_catalogue", 120) == 20
