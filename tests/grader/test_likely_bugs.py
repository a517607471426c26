"""The likely bug named from the mutant catalogue (autograder/likely_bugs.py): signatures, the
diagnosis, what the student reads, and the learned table; fast (no notebook runs)."""

import json
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import check, likely_bugs, nbgrader_plugins, outcomes
from tests.grader import mutants

LINEAR = (  # section 04's visible check of linear_scaled_lr, failed by the inverted ratio
    "linear_scaled_lr(8192, defaults) returned 0.003125; expected 3.2: 8192 examples are "
    "32 x 256, so 32 x 0.1"
)


def _case(name, ename, message, *, kind="bug", hint="", fails=("test_f",)):
    sig = likely_bugs.signature(ename, message)
    return {
        "section": "00_demo", "name": name, "kind": kind, "hint": hint, "exercise": "f",
        "exact": sig.exact, "alike": sig.alike, "near": sig.near, "fails": list(fails),
    }  # fmt: skip


def test_a_signature_masks_numbers_and_keeps_what_generalises():
    a = likely_bugs.signature("AssertionError", "rank 0 of 4: got 12.0000001 B, expected 3 B")
    b = likely_bugs.signature("AssertionError", "rank 3 of 4: got 12.0 B, expected 3.0 B")
    assert a.form == b.form == "AssertionError: rank r of #: got # B, expected # B"
    assert a.exact == b.exact, "float noise below 3 digits and which rank raised do not count"
    assert a.ratios == ("N",), "got / expected = 4 with 4 ranks: a factor of the world size"
    other_n = likely_bugs.signature("AssertionError", "rank 0 of 3: got 9 B, expected 3 B")
    assert other_n.ratios == ("N",) and other_n.alike == a.alike and other_n.exact != a.exact
    assert likely_bugs.signature("E", "got 1.5, expected 2").ratios == ("3/4",)
    assert likely_bugs.signature("E", "expected 8; got 7").ratios == ("7/8",)
    assert likely_bugs.signature("E", "no numbers compared").alike is None
    traced = likely_bugs.signature(
        "LaunchError", "launch: rank 1 of 2 raised KeyError: 'x'\n\nTraceback of rank 1:\n  File "
        '"/tmp/abc/rank.py", line 9'
    )  # fmt: skip
    assert traced.form == "KeyError: 'x'", "a rank's error is signed by the rank's own error"


def test_exact_then_alike_then_near_and_never_a_guess():
    cases = [
        _case("forgot to average", "AssertionError", "rank 0 of 4: got 12 B, expected 3 B"),
        _case("sent twice", "AssertionError", "rank 0 of 4: got 6 B, expected 3 B"),
        _case("timing off", "AssertionError", "median 4.07 ms after the backward; expected 0.1"),
    ]
    found = likely_bugs.lookup("test_f", "AssertionError", "rank 2 of 4: got 12 B, expected 3 B",
                               cases=cases)  # fmt: skip
    assert (found.name, found.level) == ("forgot to average", "exact")
    # another world size: no exact match, but the same check off by the same factor N
    found = likely_bugs.lookup("test_f", "AssertionError", "rank 0 of 8: got 24 B, expected 3 B",
                               cases=cases)  # fmt: skip
    assert (found.name, found.level) == ("forgot to average", "alike")
    twice = likely_bugs.diagnose(
        "test_f", "AssertionError", "rank 0 of 8: got 16 B, expected 8 B", cases=cases
    )
    assert twice == ("sent twice", likely_bugs.CONFIDENCE["alike"])
    timing = "median 4.4 ms after the backward; expected 0.1"
    found = likely_bugs.lookup("test_f", "AssertionError", timing, cases=cases)
    assert (found.name, found.level) == ("timing off", "near")
    # nothing alike, another error, the autograder's own errors: no name
    for ename, message in [
        ("AssertionError", "rank 0 of 4: got 5 B, expected 3 B"),
        ("TypeError", "rank 0 of 4: got 12 B, expected 3 B"),
        ("KernelDied", "the kernel died while running this cell"),
        ("HiddenTestFailed", "hidden test failed"),
        ("", ""),
    ]:
        assert likely_bugs.lookup("test_f", ename, message, cases=cases) is None, message


def test_two_mistakes_that_fail_alike_are_named_together_unless_they_are_one_mistake():
    message = "got 0.0 s, expected 0.04851 s"
    tied = [_case("the last bucket forgotten", "AssertionError", message),
            _case("communication minus backward", "AssertionError", message)]  # fmt: skip
    found = likely_bugs.lookup("test_f", "AssertionError", message, cases=tied)
    assert found.ambiguous and found.labels == (
        "the last bucket forgotten",
        "communication minus backward",
    )
    assert found.label.startswith("one of 2 mistakes that fail exactly alike: the last bucket")
    said = likely_bugs.sentence(found)
    assert (
        "one of these, which fail exactly alike: the last bucket forgotten; or communication"
        in said
    )
    assert found.confidence == likely_bugs.CONFIDENCE["exact"] / 2
    # only where the message is exactly the same: off by the same factor is not enough
    moved = "got 0.0 s, expected 0.09702 s"
    assert likely_bugs.lookup("test_f", "AssertionError", moved, cases=tied) is None
    # four or more mistakes alike: nothing named
    many = tied + [_case(f"m{i}", "AssertionError", message) for i in range(2)]
    assert likely_bugs.lookup("test_f", "AssertionError", message, cases=many) is None
    same = [_case("a", "AssertionError", message, hint="the package's function called"),
            _case("b", "AssertionError", message, kind="shortcut",
                  hint="the package's function called")]  # fmt: skip
    found = likely_bugs.lookup("test_f", "AssertionError", message, cases=same, evidence="x")
    assert found.label == "the package's function called" and found.cases == 2
    # without evidence nothing is named: the failure fits a shortcut the answer does not show,
    # so the mistake that fails alike is not named either (autograder/evidence.py)
    assert likely_bugs.lookup("test_f", "AssertionError", message, cases=same) is None
    # a variant that fails another test of the exercise too is out when that test passed
    wider = [_case("wider", "AssertionError", message, fails=("test_f", "test_g"))]
    assert (
        likely_bugs.lookup("test_f", "AssertionError", message, cases=wider, failed={"test_f"})
        is None
    )
    assert likely_bugs.lookup(
        "test_f", "AssertionError", message, cases=wider, failed={"test_f", "test_g"}
    ).name == "wider"  # fmt: skip


def test_the_student_reads_the_mistake_never_the_message():
    found = likely_bugs.Match("forgot to average", "bug", "", "exact", 1)
    said = likely_bugs.sentence(found)
    assert said.startswith("This failure looks like a typical mistake: forgot to average")
    assert "not a certainty" in said and not re.search(r"\d", said)
    hinted = likely_bugs.Match("terse", "shortcut", "the package's answer called", "near", 2)
    assert "a known shortcut: the package's answer called" in likely_bugs.sentence(hinted)
    assert (
        likely_bugs.reason(found)
        == "likely bug: forgot to average, exact match of 1 catalogued case"
    )
    failed = outcomes.FailedTest(grade_id="test_f", why="AssertionError", likely="likely bug: x")
    assert failed.phrase() == "test_f (AssertionError; likely bug: x)"


def test_the_stored_table_names_the_catalogue_and_holds_no_message():
    table = json.loads(likely_bugs.TABLE.read_text(encoding="utf-8"))
    names = {(s, a): {v.name for v in mutants.variants(nb) if v.answer == a}
             for s, nb in mutants.sections() for a in mutants.tests_of_answers(s, nb)}  # fmt: skip
    assert set(table["sections"]) == {s for s, _ in mutants.sections()}
    for test, cases in table["tests"].items():
        for case in cases:
            assert case["name"] in names[(case["section"], case["exercise"])], (test, case)
            assert case["kind"] in ("bug", "shortcut")
            for level in likely_bugs.LEVELS:  # hashes only: no hidden test's words or values
                assert case[level] is None or re.fullmatch(r"[0-9a-f]{16}", case[level]), case
    # section 04's visible check, as the inverted ratio fails it: named from the stored table
    found = likely_bugs.lookup("test_linear_scaled_lr", "AssertionError", LINEAR,
                               section="04_large_batch")  # fmt: skip
    assert found is not None and found.name == "ratio inverted: base_batch / batch_size"
    other = LINEAR.replace("0.003125", "0.2")
    assert likely_bugs.lookup("test_linear_scaled_lr", "AssertionError", other) is None


@pytest.fixture()
def demo_table(monkeypatch):
    cases = {"test_f": [_case("forgot to average", "AssertionError", "got 12 B, expected 3 B")]}
    monkeypatch.setattr(likely_bugs, "table", lambda path=None: {"tests": cases})


def _graded_test(source, outputs, score=0.0):
    cell = new_code_cell(source, outputs=outputs)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "test_f",
                                 "points": 1, "score": score}  # fmt: skip
    return cell


def test_the_feedback_page_names_the_bug_of_a_hidden_test_without_its_message(demo_table):
    source = (
        "assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(4) == 3, 'secret'\n"
        "### END HIDDEN TESTS\n"
    )
    message = "got 12 B, expected 3 B"
    trace = ["Cell In[3], line 3", f"AssertionError: {message}"]
    error = new_output("error", ename="AssertionError", evalue=message, traceback=trace)
    forged = new_code_cell("x = 1")
    forged.metadata["likely_bug"] = "forged"
    nb = new_notebook(cells=[forged, _graded_test(source, [error])])
    resources = {"nbgrader": {"assignment": "00_demo"}}
    nb, resources = nbgrader_plugins.NameLikelyBugs().preprocess(nb, resources)
    nb, resources = nbgrader_plugins.HideHiddenTests().preprocess(nb, resources)
    assert "likely_bug" not in nb.cells[0].metadata
    said = nb.cells[1].metadata["likely_bug"]
    assert said.startswith("This failure looks like a typical mistake: forgot to average")
    page = nbformat.writes(nb)
    assert "12 B" not in page and "secret" not in page and "f(4)" not in page
    passed = _graded_test(source, [], score=1.0)
    nb = nbgrader_plugins.NameLikelyBugs().preprocess(new_notebook(cells=[passed]), {})[0]
    assert "likely_bug" not in nb.cells[0].metadata


def test_the_self_check_reads_the_error_of_a_failed_visible_test(demo_table):
    text = (
        "---------------------------------------------------------------------------\n"
        "AssertionError                            Traceback (most recent call last)\n"
        "Cell In[12], line 3\n      1 x = 1\n----> 3 assert False, msg\n\n"
        "AssertionError: got 12 B, expected 3 B\n"
    )
    assert check._error_of(text) == ("AssertionError", "got 12 B, expected 3 B")
    assert check._likely("00_demo", "test_f", text).startswith("This failure looks like")
    assert check._likely("00_demo", "test_f", text.replace("12 B", "5 B")) == ""
    assert check._error_of("mismatch 'text/plain'") is None
    # the kernel's own note under the traceback (distopt/likely_bugs.py) is not the message
    noted = text + "\nLikely bug: this failure looks like a typical mistake: x (...)\n"
    assert check._likely("00_demo", "test_f", noted) == check._likely("00_demo", "test_f", text)


# --- the held-out set (tests/grader/mutants/heldout.py): never learned from ------------------


def test_the_held_out_set_is_apart_from_the_catalogue_and_labelled_with_its_mistakes():
    from tests.grader.mutants import heldout

    assert set(heldout.HELD_OUT) == {nb for _, nb in mutants.sections()}
    for section, notebook in mutants.sections():
        held = heldout.held_out(notebook)
        catalogue = mutants.variants(notebook)
        learned = [v for r in mutants.rounds(section, notebook) for v in r]  # what learn runs
        answers = mutants.reference_answers(section, notebook)
        tests = mutants.tests_of_answers(section, notebook)
        assert len(held) >= 3 and any(not h.known for h in held), notebook
        assert len({(h.variant.answer, h.variant.name) for h in held}) == len(held), notebook
        for h in held:
            v = h.variant
            assert v not in catalogue and v not in learned, (notebook, v.name)
            assert v.name not in {c.name for c in catalogue if c.answer == v.answer}, v.name
            source = v.apply(answers[v.answer])  # raises where the patch does not apply
            assert source != answers[v.answer], f"{v.name} changes nothing"
            assert set(v.fails) <= set(tests[v.answer]), (v.name, v.fails)
            # written another way: no catalogued variant of the answer is the same code
            same = [c.name for c in catalogue if c.answer == v.answer
                    and c.apply(answers[v.answer]) == source]  # fmt: skip
            assert not same, f"{notebook}: {v.name!r} is the catalogue's {same}"
            if h.known:
                twins = [c for c in catalogue if c.answer == v.answer and c.name == h.twin]
                assert twins, f"{notebook}: {v.name!r}: no catalogued {h.twin!r} in {v.answer}"
    rounds = heldout.rounds("large_batch")  # each held-out variant once, one per answer a round
    assert [h for r in rounds for h in r].count(heldout.held_out("large_batch")[0]) == 1
    assert sum(map(len, rounds)) == len(heldout.held_out("large_batch"))
    assert all(len({h.variant.answer for h in r}) == len(r) for r in rounds)


def test_a_held_out_verdict_counts_a_wrong_name_against_us():
    from tests.grader.mutants import heldout

    known = heldout.again("forgot to average", mutants.bug("f", "other code", "a", "b"))
    fresh = heldout.new(mutants.bug("f", "a mistake the catalogue lacks", "a", "b"))
    named = likely_bugs.Match("forgot to average", "bug", "", "alike", 1)
    other = likely_bugs.Match("sent twice", "bug", "", "exact", 1)
    tied = likely_bugs.Match("sent twice", "bug", "", "exact", 2, ("forgot to average",))
    assert likely_bugs.judge(known, "forgot to average", named) == "right"
    assert likely_bugs.judge(known, "forgot to average", other) == "wrong"
    assert likely_bugs.judge(known, "forgot to average", tied) == "ambiguous"
    assert likely_bugs.judge(known, "forgot to average", None) == "none"
    assert likely_bugs.judge(fresh, "", None) == "new_none"
    for found in (named, other, tied):
        assert likely_bugs.judge(fresh, "", found) == "new_wrong"
    # a partly right answer: nothing, or the mistake it fits; a shortcut's name never
    partly = heldout.partly(
        mutants.bug("f", "right for the visible cases", "a", "b"), "forgot to average"
    )
    accused = likely_bugs.Match("the visible cases looked up", "shortcut", "", "exact", 1)
    assert partly.partly and not partly.known
    assert likely_bugs.judge(partly, "forgot to average", None) == "partly_none"
    assert likely_bugs.judge(partly, "forgot to average", named) == "partly_right"
    assert likely_bugs.judge(partly, "forgot to average", other) == "partly_wrong"
    assert likely_bugs.judge(partly, "forgot to average", accused) == "partly_wrong"
