"""The likely bug behind a failed test, named from the mutant catalogue.

    python -m autograder.likely_bugs learn [SECTION]      (regenerates likely_bugs.json)
    python -m autograder.likely_bugs evaluate [SECTION]   (named right, wrong, none; own entry out)
    python -m autograder.likely_bugs heldout [SECTION]    (the held-out set: never learned from)

The catalogue (tests/grader/mutants/) holds the typical wrong answers of every exercise, each
proven to fail its own exercise's tests. ``learn`` runs them as the class run does (one round
holds one variant of every exercise, tests only) and keeps, for every test a variant fails,
what the failure looks like from outside: a :class:`Signature` of the error's name and message.
A signature generalises the message in three steps:

* **exact**: the message with every number replaced by ``#`` (its *form*), and the numbers
  rounded to 3 significant digits (float noise of another CPU does not reach them);
* **alike**: the form and the ratio of the two numbers an assertion compares ("got X,
  expected Y", "returned X; expected Y"): X/Y as a small fraction, or in terms of the world
  size N when the message states it (N, 1/N, (N-1)/N, 2(N-1)/N ...), so that the same bug
  on another case (a hidden test's other N, another seed) still matches;
* **near**: the form and the numbers rounded to 1 significant digit (a timing or a
  training loss that moves a little from run to run).

Which rank raised first, temporary paths and tracebacks are left out of every level.

:func:`diagnose` tries them in this order and names a mistake only when every catalogued
case that matches at the first level that matches carries the same name (or the same
``hint``: two variants that are one mistake in the student's words); where two or three
different mistakes fail with exactly the same message (the test cannot tell them apart from
outside), it names all of them ("one of 2 mistakes that fail exactly alike: ..."), which
``evaluate`` counts as *ambiguous*, neither right nor wrong; when nothing matches, or
different mistakes match only at a rougher level, it returns None: no typical bug
recognised, and nothing is guessed. The table is likely_bugs.json beside this
module, written by ``learn``: the grader reads only that file (never the tests), and it holds
the variants' names and hashes of their signatures, never a hidden test's words or values.
``learn`` also writes the notebooks' table, shared/distopt/likely_bugs.json: the cases of
failures raised by a test's visible part only (the line the test cell stopped at lies above
its hidden tests), which :mod:`distopt.likely_bugs` names under a failed test's traceback in
the student's own kernel. The signatures themselves are computed there, one code for both.

How well it names a mistake it was not trained on is measured on the held-out set
(tests/grader/mutants/heldout.py): mistakes of the catalogue written a second time, with
other code, and mistakes the catalogue does not have; ``learn`` never reads them, and
``heldout`` runs them as students and counts, for the known mistakes, named right, wrong,
ambiguous or not at all, and for the new ones, nothing named (right) or a name (wrong).

What the student reads is :func:`sentence`: the mistake's name (or its ``hint`` in the
catalogue, where the name is terse), never the test's message.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autograder import course, evidence
from autograder.evidence import GUARD_ERRORS
from distopt.likely_bugs import MAX_CHARS, Signature, rank_error, signature  # noqa: F401

TABLE = Path(__file__).with_name("likely_bugs.json")

# Errors the autograder itself writes (autograder.outcomes, HideHiddenTests): a timeout or a
# dead kernel says nothing about which mistake the answer holds.
NOT_DIAGNOSED = frozenset(
    {"KernelDied", "KernelLost", "NotRun", "CellTimeoutError", "IntegrityError",
     "HiddenTestFailed", "NotImplementedError"}
)  # fmt: skip
LEVELS = ("exact", "alike", "near")
CONFIDENCE = {"exact": 0.95, "alike": 0.8, "near": 0.7}
# Where up to this many catalogued mistakes fail with exactly the same message (no test can
# tell them apart from outside), all of them are named, as "one of N mistakes"; more, or a
# tie at a rougher level than exact, and nothing is named.
MAX_TIED = 3

# --- the table and the diagnosis ----------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"tests": {}}


def table(path: Path | None = None) -> dict:
    """The learned table: {"tests": {test: [case, ...]}, "sections": {...}}."""
    return _load(str(path or TABLE))


@dataclass(frozen=True)
class Match:
    """A named mistake: its name and kind, the student's words, the level, the cases."""

    name: str
    kind: str  # "bug" or "shortcut"
    hint: str  # the student's words for it, or "" (the name is used)
    level: str  # "exact", "alike" or "near"
    cases: int  # catalogued cases that match at this level (all of this mistake)
    others: tuple[str, ...] = ()  # the other mistakes that fail exactly alike (ambiguous)
    evidence: str = ""  # for a shortcut: what shows it (autograder.evidence), quoted

    @property
    def confidence(self) -> float:
        return CONFIDENCE[self.level] / (1 + len(self.others))

    @property
    def ambiguous(self) -> bool:
        return bool(self.others)

    @property
    def labels(self) -> tuple[str, ...]:
        """The mistake's words, or each of the mistakes' words where they tie."""
        return (self.hint or self.name, *self.others)

    @property
    def label(self) -> str:
        if not self.others:
            return self.hint or self.name
        words = "; or ".join(x.rstrip(".") for x in self.labels)
        return f"one of {len(self.labels)} mistakes that fail exactly alike: {words}"


def lookup(
    test: str,
    ename: str,
    message: str,
    *,
    cases: list[dict] | None = None,
    failed: set[str] | None = None,
    section: str | None = None,
    evidence: str = "",
) -> Match | None:
    """The catalogued mistake that a failure of ``test`` looks like, or None.

    ``cases``: the table's cases of ``test`` (default: likely_bugs.json's, of ``section`` if
    given). ``failed``: the tests of the notebook that failed, if known; cases whose variant
    fails other tests of the exercise than these are left out. A *shortcut* is named only on
    evidence: a guard's own refusal in the error (:data:`GUARD_ERRORS`), or ``evidence``, what
    the answer's source shows (:func:`autograder.evidence.for_test`); a failure pattern alone
    never accuses a student of one."""
    if not ename or ename in NOT_DIAGNOSED:
        return None
    if cases is None:
        cases = table().get("tests", {}).get(test, [])
        cases = [c for c in cases if section in (None, c.get("section"))]
    if failed is not None:
        cases = [c for c in cases if set(c.get("fails", [test])) <= failed | {test}]
    guarded = rank_error(ename, message)[0] in GUARD_ERRORS
    if guarded and not evidence:
        evidence = "a guard of the course refused it"
    level, found = matching(signature(ename, message), cases)
    if not evidence and any(c.get("kind") == "shortcut" for c in found):
        # the failure looks like a shortcut but the answer shows none: say nothing, neither
        # the shortcut nor a mistake that happens to fail alike (it could be either, or an
        # honest answer wrong for a hidden case only)
        return None
    labels = list(dict.fromkeys(c.get("hint") or c["name"] for c in found))
    if not labels or len(labels) > 1 and (level != "exact" or len(labels) > MAX_TIED):
        return None  # nothing matches, or different mistakes look only roughly alike
    first = found[0]
    shown = evidence if any(c.get("kind") == "shortcut" for c in found) else ""
    return Match(
        first["name"],
        first["kind"],
        first.get("hint", ""),
        level,
        len(found),
        tuple(labels[1:]),
        shown,
    )


def matching(sig: Signature, cases: list[dict]) -> tuple[str, list[dict]]:
    """The first level at which some of ``cases`` match ``sig``, and those cases."""
    for level in LEVELS:
        key = sig.key(level)
        found = [c for c in cases if key is not None and c[level] == key]
        if found:
            return level, found
    return "", []


def diagnose(
    test: str, ename: str, message: str, *, cases: list[dict] | None = None
) -> tuple[str, float] | None:
    """(the likely mistake's name, confidence) for a failure of ``test``, or None: no typical
    bug recognised."""
    found = lookup(test, ename, message, cases=cases)
    return None if found is None else (found.name, found.confidence)


def sentence(found: Match) -> str:
    """What the student reads beside the failed test: the mistake in words, how sure (an
    exact match "looks like"; a rougher one only "may be"), and for a shortcut what in the
    answer shows it."""
    what = "a typical mistake" if found.kind == "bug" else "a known shortcut"
    if found.ambiguous:
        what = "one of these, which fail exactly alike"
    sure = {
        "exact": "it fails exactly as that one does",
        "alike": "its numbers are off as that one's are; not sure",
        "near": "it fails as that one does, its numbers about the same; not sure",
    }[found.level]
    verb = "looks like" if found.level == "exact" else "may be"
    label = "; or ".join(x.rstrip(".") for x in found.labels)
    said = f"This failure {verb} {what}: {label} ({sure}; a likely cause, not a certainty)."
    if found.evidence:
        said += f" What shows it in your answer: {found.evidence}."
    return said


def reason(found: Match) -> str:
    """The words of grades.csv's reason for a failed test with a named mistake: "likely bug"
    for a mistake, "suspected shortcut" (with its evidence, for a person to read) for one."""
    cases = f"{found.cases} catalogued case{'s' if found.cases != 1 else ''}"
    if found.kind == "shortcut" and found.evidence:
        return (
            f"suspected shortcut: {found.label}, {found.level} match of {cases}; "
            f"evidence: {found.evidence}"
        )
    return f"likely bug: {found.label}, {found.level} match of {cases}"


# --- learning it from the catalogue (a course author's command: imports the tests) --------


def _case(
    test: str, variant, ename: str, message: str, fails: list[str], visible: bool = False
) -> dict:
    sig = signature(ename, message)
    case = {
        "name": variant.name,
        "kind": variant.kind,
        "hint": getattr(variant, "hint", ""),
        "exercise": variant.answer,
        "exact": sig.exact,
        "alike": sig.alike,
        "near": sig.near,
        "fails": fails,
        "visible": visible,  # raised by the test's visible part: shipped to the notebooks
        "guard": rank_error(ename, message)[0] in GUARD_ERRORS,  # a refusal shows a shortcut
    }
    if not case["guard"]:
        del case["guard"]
    if not case["hint"]:
        del case["hint"]
    if fails == [test]:  # the usual: the exercise's only test
        del case["fails"]
    return case


_CELL_LINE = re.compile(r"Cell In\[\d+\], line (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_errors(section: str, notebook: str, chosen: list) -> dict[str, tuple[str, str, bool, str]]:
    """As tests/grader/mutants' ``test_errors`` (the reference notebook with ``chosen`` in
    place, tests only), whether each error was raised by the test's visible part (the line of
    the test cell it stopped at lies above ``### BEGIN HIDDEN TESTS``), and the evidence of a
    shortcut the answers show (:mod:`autograder.evidence`, as the grader reads it)."""
    import nbformat

    from autograder import runner
    from tests.grader import mutants

    nb = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
    evidence_of = {}
    reference = mutants.reference_answers(section, notebook)
    by_answer = {v.answer: v.apply(reference[v.answer]) for v in chosen}
    for cell in nb.cells:
        if mutants._is_answer(cell):
            cell.source = by_answer.get(mutants._grade_id(cell), reference[mutants._grade_id(cell)])
    for cell in nb.cells:
        if course.is_test(cell):
            test = mutants._grade_id(cell)
            evidence_of[test] = evidence.in_submission(nb, section, test)
    nb = mutants.tests_only(nb)
    runner.run(nb, course.SOLUTIONS / section, timeout=300, allow_errors=True)
    found = {}
    for cell in nb.cells:
        errors = (
            [o for o in cell.outputs if o.output_type == "error"] if course.is_test(cell) else []
        )
        if errors:
            found[mutants._grade_id(cell)] = (
                errors[0].ename,
                errors[0].evalue,
                _visible(cell.source, errors[0].traceback),
                evidence_of.get(mutants._grade_id(cell), ""),
            )
    return found


def _visible(source: str, traceback: list[str]) -> bool:
    """Whether the error stopped the test cell above its hidden tests (the first frame of a
    traceback is the cell's own)."""
    hidden = next(
        (i for i, line in enumerate(source.splitlines(), 1) if "BEGIN HIDDEN TESTS" in line), None
    )
    found = _CELL_LINE.search(_ANSI.sub("", "\n".join(traceback)))
    if hidden is None:
        return True
    return found is not None and int(found.group(1)) < hidden


def observe(section: str, *, rounds: list | None = None) -> list[tuple]:
    """Run the catalogue's rounds of ``section`` (tests only, as tests/grader/mutants does):
    (test, variant, ename, message, visible, evidence) for every failed test, its own variant
    named."""
    from tests.grader import mutants

    notebook = course.section_notebooks(section)[0]
    tests = mutants.tests_of_answers(section, notebook)
    owner = {t: a for a, ts in tests.items() for t in ts}
    found = []
    for chosen in rounds if rounds is not None else mutants.rounds(section, notebook):
        by_answer = {v.answer: v for v in chosen}
        for test, (ename, message, visible, shows) in test_errors(
            section, notebook, chosen
        ).items():
            variant = by_answer.get(owner.get(test))
            if variant is not None:
                found.append((test, variant, ename, message, visible, shows))
    return found


def _fails(section: str, variant) -> list[str]:
    from tests.grader import mutants

    notebook = course.section_notebooks(section)[0]
    return sorted(mutants.expected_failures(section, notebook, variant))


def learn(sections: list[str]) -> dict:
    """Run the rounds of ``sections`` and write their cases into likely_bugs.json (the other
    sections' cases are kept)."""
    data = json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.is_file() else {}
    tests: dict[str, list] = data.get("tests", {})
    about: dict[str, dict] = data.get("sections", {})
    for section in sections:
        start = time.perf_counter()
        seen = observe(section)
        learned: dict[str, list] = {}
        for test, variant, ename, message, visible, _ in seen:
            case = _case(test, variant, ename, message, _fails(section, variant), visible)
            if case not in learned.setdefault(test, []):  # the cascade round repeats some
                learned[test].append(case)
        for test in [t for t, cs in tests.items() if cs and cs[0].get("section") == section]:
            del tests[test]
        for test, cases in learned.items():
            tests[test] = [{"section": section, **c} for c in cases]
        about[section] = {
            "cases": sum(map(len, learned.values())),
            "variants": len({(c["exercise"], c["name"]) for cs in learned.values() for c in cs}),
            "learned_s": round(time.perf_counter() - start),
        }
        print(f"{section}: {about[section]}", flush=True)
    data = {
        "about": "autograder/likely_bugs.py: the catalogued mistakes' failures, per test "
        "(python -m autograder.likely_bugs learn)",
        "sections": dict(sorted(about.items())),
        "tests": dict(sorted(tests.items())),
    }
    TABLE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    ship(data)
    _load.cache_clear()
    return data


def ship(data: dict) -> None:
    """Write the notebooks' table (distopt/likely_bugs.json): the cases of failures raised by
    a test's visible part only, whose messages a student sees anyway; never a hidden test's."""
    from distopt import likely_bugs as notebook_side

    keep = ("name", "kind", "hint", "exercise", "exact", "alike", "near")
    tests = {
        test: shown
        for test, cases in data["tests"].items()
        if (shown := [{k: c[k] for k in keep if k in c} for c in cases if _shipped(c)])
    }
    about = "the visible tests' catalogued failures (autograder/likely_bugs.py writes it)"
    text = json.dumps({"about": about, "tests": tests}, indent=1, sort_keys=True) + "\n"
    notebook_side.TABLE.write_text(text, encoding="utf-8")


def _shipped(case: dict) -> bool:
    """A case the notebook's kernel may name: raised by the visible part, and a mistake or a
    shortcut that a guard refused (the kernel cannot read the answer for other evidence)."""
    return bool(case.get("visible")) and (case["kind"] != "shortcut" or case.get("guard", False))


def score(seen: list[tuple[str, object, str, str]], cases: dict[str, list]) -> dict[str, int]:
    """Named right, wrong, ambiguous (it and the mistakes that fail exactly alike named) and
    none over failed tests ``seen``, diagnosed against ``cases`` (per test); and with its own
    entry removed ("held_"): each variant's failures against the cases without it (a mistake
    the catalogue then lacks: "none" is the honest answer, "right" only where another variant
    is the same mistake). The held-out set proper, answers never learned from, is
    :func:`heldout`'s."""
    counts = dict.fromkeys(
        ("right", "wrong", "none", "tied", "ambiguous", "ambiguous_wrong",
         "held_right", "held_wrong", "held_none", "held_ambiguous"),
        0,
    )  # fmt: skip
    for test, variant, ename, message, _, shows in seen:
        own = cases.get(test, [])
        right = getattr(variant, "hint", "") or variant.name
        others = [c for c in own if (c["exercise"], c["name"]) != (variant.answer, variant.name)]
        for prefix, pool in (("", own), ("held_", others)):
            found = lookup(test, ename, message, cases=pool, evidence=shows)
            verdict = "none" if found is None else "right" if found.label == right else "wrong"
            if found is not None and found.ambiguous:  # several named: neither right nor wrong
                verdict = "ambiguous" if right in found.labels or prefix else "ambiguous_wrong"
            counts[prefix + verdict] += 1
            if prefix or verdict in ("right", "ambiguous"):
                continue
            if found is None and matching(signature(ename, message), pool)[1]:
                counts["tied"] += 1  # another mistake fails exactly alike
            else:  # a message that moved from the learned run, or a wrong name: say which
                print(f"  {verdict}: {test}, {variant.name}: {ename}: {message[:160]!r}")
    return counts


def evaluate(sections: list[str]) -> dict[str, dict[str, int]]:
    """Run the rounds again (a fresh run, as students are graded) and score the diagnoses
    against likely_bugs.json; the reference answers must get no test failed or named."""
    cases = table()["tests"]
    results = {}
    for section in sections:
        start = time.perf_counter()
        notebook = course.section_notebooks(section)[0]
        reference = test_errors(section, notebook, [])
        named = [t for t, (e, m, _, x) in reference.items() if lookup(t, e, m, evidence=x)]
        counts = score(observe(section), cases)
        counts["reference_failed"], counts["reference_named"] = len(reference), len(named)
        counts["seconds"] = round(time.perf_counter() - start)
        results[section] = counts
        print(f"{section}: {_rates(counts)}", flush=True)
    total = {k: sum(r[k] for r in results.values()) for k in next(iter(results.values()))}
    print(f"all: {_rates(total)}")
    return results


HELD_OUT_VERDICTS = ("right", "wrong", "ambiguous", "none", "new_none", "new_wrong", "escaped",
                     "partly_none", "partly_right", "partly_wrong", "partly_visible")  # fmt: skip
HELD_OUT_COUNTS = (*HELD_OUT_VERDICTS, *(f"right_{level}" for level in LEVELS))


def judge(held, twin_label: str, found: Match | None) -> str:
    """The verdict on a held-out variant's failed test: for a known mistake (``held.known``)
    "right" (its twin named alone), "ambiguous" (named among those that fail exactly alike),
    "wrong" (another mistake named) or "none"; for a new one "new_none" (nothing named: the
    honest answer) or "new_wrong" (any name); for a partly right answer (``held.partly``)
    "partly_none" (nothing named), "partly_right" (the mistake it fits) or "partly_wrong" (any
    other name, a shortcut's above all: it accuses an honest student)."""
    if getattr(held, "partly", False):
        if found is None:
            return "partly_none"
        fits = found.kind != "shortcut" and twin_label and twin_label in found.labels
        return "partly_right" if fits else "partly_wrong"
    if not held.known:
        return "new_none" if found is None else "new_wrong"
    if found is None:
        return "none"
    if found.ambiguous:
        return "ambiguous" if twin_label in found.labels else "wrong"
    return "right" if found.label == twin_label else "wrong"


def heldout(sections: list[str], *, quiet: bool = False) -> dict[str, dict[str, int]]:
    """Run the held-out variants of ``sections`` as students (tests only, in rounds, as
    ``observe`` does) and diagnose each failed test of theirs against likely_bugs.json.

    Counted per failed test, as ``evaluate`` does; "escaped" counts the held-out variants
    whose own exercise's tests did not all fail (a broken held-out variant: fix it). A round
    whose failing tests are not exactly its variants' is reported too (a cascade)."""
    from tests.grader import mutants
    from tests.grader.mutants import heldout as held_set

    cases = table()["tests"]
    results = {}
    for section in sections:
        start = time.perf_counter()
        notebook = course.section_notebooks(section)[0]
        catalogue = {(v.answer, v.name): v for v in mutants.variants(notebook)}
        owner = {t: a for a, ts in mutants.tests_of_answers(section, notebook).items() for t in ts}
        counts = dict.fromkeys(HELD_OUT_COUNTS, 0)
        counts["known_variants"] = counts["new_variants"] = counts["cascades"] = 0
        counts["partly_variants"] = 0
        for chosen in held_set.rounds(notebook):
            errors = test_errors(section, notebook, [h.variant for h in chosen])
            expected = set().union(
                *(mutants.expected_failures(section, notebook, h.variant) for h in chosen)
            )
            if set(errors) != expected:
                counts["cascades"] += 1
                print(f"  round fails {sorted(set(errors) ^ expected)} beyond or short of its "
                      "variants' tests", flush=True)  # fmt: skip
            for h in chosen:
                kind = "partly" if h.partly else "known" if h.known else "new"
                counts[f"{kind}_variants"] += 1
                own = mutants.expected_failures(section, notebook, h.variant)
                if not own <= set(errors):
                    counts["escaped"] += 1
                    print(f"  ESCAPED {h.variant.answer}: {h.variant.name}: passes "
                          f"{sorted(own - set(errors))}", flush=True)  # fmt: skip
                twin = catalogue.get((h.variant.answer, h.twin))
                twin_label = (twin.hint or twin.name) if twin is not None else ""
                failed = own & set(errors)
                for test in sorted(t for t in failed if owner.get(t) == h.variant.answer):
                    ename, message, visible, shows = errors[test]
                    if h.partly and visible:  # not partly right: a visible check fails
                        counts["partly_visible"] += 1
                        print(f"  NOT PARTLY {test}, {h.variant.name!r}: fails a visible check")
                        continue
                    found = lookup(
                        test, ename, message, cases=cases.get(test, []), failed=failed,
                        evidence=shows,
                    )  # fmt: skip
                    verdict = judge(h, twin_label, found)
                    counts[verdict] += 1
                    if verdict == "right":  # at which level: the same numbers, or alike
                        counts[f"right_{found.level}"] += 1
                    if not quiet:
                        named = "nothing" if found is None else f"{found.level}: {found.label!r}"
                        print(f"  {verdict:9s} {test}, {h.variant.name!r} -> {named}", flush=True)
        counts["seconds"] = round(time.perf_counter() - start)
        results[section] = counts
        print(f"{section}: {_held_rates(counts)}", flush=True)
    if results:
        total = {k: sum(r[k] for r in results.values()) for k in next(iter(results.values()))}
        print(f"all: {_held_rates(total)}")
    return results


def _held_rates(c: dict[str, int]) -> str:
    known = c["right"] + c["wrong"] + c["ambiguous"] + c["none"]
    fresh = c["new_none"] + c["new_wrong"]
    partly = c["partly_none"] + c["partly_right"] + c["partly_wrong"]
    pct = lambda k, n: f"{100 * c[k] / n:.0f} %" if n else "-"  # noqa: E731
    return (
        f"known mistakes written another way ({c['known_variants']} variants, {known} failed "
        f"tests): right {c['right']} ({pct('right', known)}; exact {c['right_exact']}, alike "
        f"{c['right_alike']}, near {c['right_near']}), wrong {c['wrong']} "
        f"({pct('wrong', known)}), ambiguous {c['ambiguous']} ({pct('ambiguous', known)}), "
        f"none {c['none']} ({pct('none', known)}); new mistakes ({c['new_variants']} variants, "
        f"{fresh} failed tests): nothing named {c['new_none']} ({pct('new_none', fresh)}), a "
        f"name {c['new_wrong']} ({pct('new_wrong', fresh)}); partly right answers "
        f"({c['partly_variants']} variants, {partly} failed tests): nothing named "
        f"{c['partly_none']}, the mistake they fit {c['partly_right']}, a wrong name "
        f"{c['partly_wrong']} ({pct('partly_wrong', partly)}), failing a visible check "
        f"{c['partly_visible']}; escaped {c['escaped']}, cascading rounds {c['cascades']}, "
        f"{c['seconds']} s"
    )


def _rates(c: dict[str, int]) -> str:
    n = c["right"] + c["wrong"] + c["none"] + c["ambiguous"] + c["ambiguous_wrong"]
    if not n:
        return "no failed tests"
    pct = lambda k: f"{100 * c[k] / n:.1f} %"  # noqa: E731
    return (
        f"{n} failures: named right {c['right']} ({pct('right')}), wrong {c['wrong']} "
        f"({pct('wrong')}), ambiguous {c['ambiguous']} ({pct('ambiguous')}: it and the other "
        f"mistakes that fail exactly alike named; {c['ambiguous_wrong']} without it), none "
        f"{c['none']} ({pct('none')}; {c['tied']} of them tied with another mistake that fails "
        f"alike); own entry removed: right {c['held_right']} ({pct('held_right')}), wrong "
        f"{c['held_wrong']} ({pct('held_wrong')}), ambiguous {c['held_ambiguous']} "
        f"({pct('held_ambiguous')}), none {c['held_none']} ({pct('held_none')}); reference: "
        f"{c.get('reference_failed', 0)} failed, {c.get('reference_named', 0)} named"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.likely_bugs")
    parser.add_argument("command", choices=("learn", "evaluate", "heldout"))
    parser.add_argument("section", nargs="*", help="default: every section")
    args = parser.parse_args(argv)
    sections = args.section or list(course.sections())
    if args.command == "learn":
        learn(sections)
    elif args.command == "evaluate":
        evaluate(sections)
    else:
        found = heldout(sections)
        broken = ("escaped", "partly_visible", "partly_wrong")
        return 1 if any(r[k] for r in found.values() for k in broken) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
