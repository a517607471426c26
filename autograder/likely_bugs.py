"""The likely bug behind a failed test, named from the mutant catalogue.

    python -m autograder.likely_bugs learn [SECTION]      (regenerates likely_bugs.json)
    python -m autograder.likely_bugs evaluate [SECTION]   (named right, wrong, none; held out)

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
``hint``: two variants that are one mistake in the student's words); when nothing matches,
or two different mistakes match (some tests cannot tell two bugs apart), it returns None: no
typical bug recognised, and nothing is guessed. The table is likely_bugs.json beside this
module, written by ``learn``: the grader reads only that file (never the tests), and it holds
the variants' names and hashes of their signatures, never a hidden test's words or values.

What the student reads is :func:`sentence`: the mistake's name (or its ``hint`` in the
catalogue, where the name is terse), never the test's message.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from autograder import course

TABLE = Path(__file__).with_name("likely_bugs.json")

# Errors the autograder itself writes (autograder.outcomes, HideHiddenTests): a timeout or a
# dead kernel says nothing about which mistake the answer holds.
NOT_DIAGNOSED = frozenset(
    {"KernelDied", "KernelLost", "NotRun", "CellTimeoutError", "IntegrityError",
     "HiddenTestFailed", "NotImplementedError"}
)  # fmt: skip
LEVELS = ("exact", "alike", "near")
CONFIDENCE = {"exact": 0.95, "alike": 0.8, "near": 0.7}
MAX_CHARS = 1000  # of a message: the grader keeps the head of long ones

_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.]*[A-Za-z_])"
)
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.+-]+){2,}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_RANK = re.compile(r"\b(rank) \d+\b")
_TRACEBACK = re.compile(r"\n\s*\n?\s*Traceback\b.*", re.DOTALL)
_WORLD = re.compile(
    r"\b(?:of|on|world[_ ]size[ =:]*|N *=) *(\d+)\b"
    r"|\b(\d+) (?:ranks|workers|GPUs|devices|processes)\b"
)
_YOURS = r"(?:got|returned|yours|gave|measured|is|be|was)"
_COMPARED = (  # (regex, group of "yours", group of "expected"); NUM: a number
    (rf"expected:? NUM[^;.\d]{{0,30}}?[;,] *{_YOURS}:? NUM", 2, 1),
    (rf"{_YOURS}:? NUM[^;\d]{{0,30}}?[;,]? *(?:but )?expected:? NUM", 1, 2),
    (r"NUM[^\d;,]{0,12}[;,] *expected:? NUM", 1, 2),
    (r"NUM[^\d;,]{0,12} instead of NUM", 1, 2),
)


def _parse(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("_", ""))
    except ValueError:
        return None


@dataclass(frozen=True)
class Signature:
    """What a failure looks like from outside, at the three levels of generality."""

    form: str  # the error's name and message, numbers replaced by "#"
    exact: str  # a hash of the form and the numbers, 3 significant digits
    ratios: tuple[str, ...]  # the classes of yours / expected of each compared pair
    near: str  # a hash of the form and the numbers, 1 significant digit

    @property
    def alike(self) -> str | None:
        """A hash of the form and the ratios' classes, or None without compared numbers."""
        if not self.ratios:
            return None
        return hashlib.sha256(f"{self.form}|{'|'.join(self.ratios)}".encode()).hexdigest()[:16]

    def key(self, level: str) -> str | None:
        """The signature at ``level``, or None where it has none (no compared numbers)."""
        if level == "exact":
            return self.exact
        return self.alike if level == "alike" else self.near


def _cleaned(message: str) -> str:
    text = _TRACEBACK.sub("", str(message)[:MAX_CHARS])
    text = _ADDRESS.sub("0x", _PATH.sub("<path>", text))
    text = _RANK.sub(r"\1 r", text)  # which rank raised first varies from run to run
    return " ".join(text.split())


def _ratio_class(yours: float, expected: float, world: set[int]) -> str:
    """yours / expected in words: "N", "(N-1)/N", "1/2", "0", "~0.177", ..."""
    if expected == 0:
        return "expected 0" if yours != 0 else "1"
    r = yours / expected
    if r == 0:
        return "0"
    for n in sorted(world):
        if n < 2:
            continue
        forms = {
            "N": n, "1/N": 1 / n, "(N-1)/N": (n - 1) / n, "N/(N-1)": n / (n - 1),
            "2(N-1)/N": 2 * (n - 1) / n, "N/(2(N-1))": n / (2 * (n - 1)), "N-1": n - 1,
            "1/(N-1)": 1 / (n - 1), "N^2": n * n, "1/N^2": 1 / (n * n),
        }  # fmt: skip
        for name, value in forms.items():
            if value not in (1, 2, 0.5) and math.isclose(r, value, rel_tol=1e-3):
                return name
    close = Fraction(r).limit_denominator(16)
    if close and abs(close.numerator) <= 64 and math.isclose(r, float(close), rel_tol=1e-3):
        return str(close)
    if r < 0:
        return f"-~{float(f'{-r:.2g}'):g}"
    return f"~{float(f'{r:.2g}'):g}"


def signature(ename: str, message: str) -> Signature:
    """The signature of a failed test's error (its name and message)."""
    text = _cleaned(message)
    numbers = [_parse(m.group()) for m in _NUMBER.finditer(text)]
    form = f"{ename}: {_NUMBER.sub('#', text)}"
    exact, near = (_hashed(form, numbers, digits) for digits in (3, 1))
    world = {int(a or b) for a, b in _WORLD.findall(text)}
    ratios = []
    marked = _NUMBER.sub(lambda m: f"<{m.group()}>", text)
    for pattern, yours, expected in _COMPARED:
        for found in re.finditer(pattern.replace("NUM", r"<([^>]*)>"), marked):
            a, b = _parse(found.group(yours)), _parse(found.group(expected))
            if a is not None and b is not None:
                ratios.append(_ratio_class(a, b, world))
        if ratios:
            break
    return Signature(form=form, exact=exact, ratios=tuple(ratios), near=near)


def _hashed(form: str, numbers: list[float | None], digits: int) -> str:
    shown = ",".join("?" if x is None else f"{x:.{digits}g}" for x in numbers)
    return hashlib.sha256(f"{form}|{shown}".encode()).hexdigest()[:16]


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

    @property
    def confidence(self) -> float:
        return CONFIDENCE[self.level]

    @property
    def label(self) -> str:
        return self.hint or self.name


def lookup(
    test: str,
    ename: str,
    message: str,
    *,
    cases: list[dict] | None = None,
    failed: set[str] | None = None,
    section: str | None = None,
) -> Match | None:
    """The catalogued mistake that a failure of ``test`` looks like, or None.

    ``cases``: the table's cases of ``test`` (default: likely_bugs.json's, of ``section`` if
    given). ``failed``: the tests of the notebook that failed, if known; cases whose variant
    fails other tests of the exercise than these are left out."""
    if not ename or ename in NOT_DIAGNOSED:
        return None
    if cases is None:
        cases = table().get("tests", {}).get(test, [])
        cases = [c for c in cases if section in (None, c.get("section"))]
    if failed is not None:
        cases = [c for c in cases if set(c.get("fails", [test])) <= failed | {test}]
    level, found = matching(signature(ename, message), cases)
    if len({c.get("hint") or c["name"] for c in found}) != 1:
        return None  # nothing matches, or two different mistakes look alike: say nothing
    first = found[0]
    return Match(first["name"], first["kind"], first.get("hint", ""), level, len(found))


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
    """What the student reads beside the failed test: the mistake in words, how sure."""
    what = "a typical mistake" if found.kind == "bug" else "a known shortcut"
    sure = {
        "exact": "it fails exactly as that one does",
        "alike": "its numbers are off as that one's are",
        "near": "it fails as that one does, its numbers about the same",
    }[found.level]
    label = found.label.rstrip(".")
    return f"This failure looks like {what}: {label} ({sure}; a likely cause, not a certainty)."


def reason(found: Match) -> str:
    """The words of grades.csv's reason for a failed test with a named mistake."""
    cases = f"{found.cases} catalogued case{'s' if found.cases != 1 else ''}"
    return f"likely bug: {found.label}, {found.level} match of {cases}"


# --- learning it from the catalogue (a course author's command: imports the tests) --------


def _case(test: str, variant, ename: str, message: str, fails: list[str]) -> dict:
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
    }
    if not case["hint"]:
        del case["hint"]
    if fails == [test]:  # the usual: the exercise's only test
        del case["fails"]
    return case


def observe(section: str, *, rounds: list | None = None) -> list[tuple[str, object, str, str]]:
    """Run the catalogue's rounds of ``section`` (tests only, as tests/grader/mutants does):
    (test, variant, ename, message) for every failed test, its own variant named."""
    from tests.grader import mutants
    from tests.grader.mutants.__main__ import test_errors

    notebook = course.section_notebooks(section)[0]
    tests = mutants.tests_of_answers(section, notebook)
    owner = {t: a for a, ts in tests.items() for t in ts}
    found = []
    for chosen in rounds if rounds is not None else mutants.rounds(section, notebook):
        by_answer = {v.answer: v for v in chosen}
        for test, (ename, message) in test_errors(section, notebook, chosen).items():
            variant = by_answer.get(owner.get(test))
            if variant is not None:
                found.append((test, variant, ename, message))
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
        for test, variant, ename, message in seen:
            case = _case(test, variant, ename, message, _fails(section, variant))
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
    _load.cache_clear()
    return data


def score(seen: list[tuple[str, object, str, str]], cases: dict[str, list]) -> dict[str, int]:
    """Named right, wrong and none over failed tests ``seen``, diagnosed against ``cases``
    (per test); and held out: each variant's failures against the cases without it."""
    counts = dict.fromkeys(
        ("right", "wrong", "none", "tied", "held_right", "held_wrong", "held_none"), 0
    )
    for test, variant, ename, message in seen:
        own = cases.get(test, [])
        right = getattr(variant, "hint", "") or variant.name
        others = [c for c in own if (c["exercise"], c["name"]) != (variant.answer, variant.name)]
        for prefix, pool in (("", own), ("held_", others)):
            found = lookup(test, ename, message, cases=pool)
            verdict = "none" if found is None else "right" if found.label == right else "wrong"
            counts[prefix + verdict] += 1
            if prefix or found is not None and verdict == "right":
                continue
            if found is None and matching(signature(ename, message), pool)[1]:
                counts["tied"] += 1  # another mistake fails exactly alike
            else:  # a message that moved from the learned run, or a wrong name: say which
                print(f"  {verdict}: {test}, {variant.name}: {ename}: {message[:160]!r}")
    return counts


def evaluate(sections: list[str]) -> dict[str, dict[str, int]]:
    """Run the rounds again (a fresh run, as students are graded) and score the diagnoses
    against likely_bugs.json; the reference answers must get no test failed or named."""
    from tests.grader.mutants.__main__ import test_errors

    cases = table()["tests"]
    results = {}
    for section in sections:
        start = time.perf_counter()
        notebook = course.section_notebooks(section)[0]
        reference = test_errors(section, notebook, [])
        named = [t for t, (e, m) in reference.items() if lookup(t, e, m) is not None]
        counts = score(observe(section), cases)
        counts["reference_failed"], counts["reference_named"] = len(reference), len(named)
        counts["seconds"] = round(time.perf_counter() - start)
        results[section] = counts
        print(f"{section}: {_rates(counts)}", flush=True)
    total = {k: sum(r[k] for r in results.values()) for k in next(iter(results.values()))}
    print(f"all: {_rates(total)}")
    return results


def _rates(c: dict[str, int]) -> str:
    n = c["right"] + c["wrong"] + c["none"]
    if not n:
        return "no failed tests"
    pct = lambda k: f"{100 * c[k] / n:.1f} %"  # noqa: E731
    return (
        f"{n} failures: named right {c['right']} ({pct('right')}), wrong {c['wrong']} "
        f"({pct('wrong')}), none {c['none']} ({pct('none')}; {c['tied']} of them tied with "
        "another mistake that fails alike); held out: right "
        f"{c['held_right']} ({pct('held_right')}), wrong {c['held_wrong']} "
        f"({pct('held_wrong')}), none {c['held_none']} ({pct('held_none')}); reference: "
        f"{c.get('reference_failed', 0)} failed, {c.get('reference_named', 0)} named"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.likely_bugs")
    parser.add_argument("command", choices=("learn", "evaluate"))
    parser.add_argument("section", nargs="*", help="default: every section")
    args = parser.parse_args(argv)
    sections = args.section or list(course.sections())
    if args.command == "learn":
        learn(sections)
    else:
        evaluate(sections)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
