"""The likely bug behind a failed test, on the notebook's side: failure signatures, and a note
under a failed test cell's traceback that names the catalogued mistake it looks like.

The autograder (autograder/likely_bugs.py) learns, from the course's catalogue of typical
wrong answers, what each mistake's failures look like: a :class:`Signature` of the error's
name and message, at three levels of generality (exact numbers, the ratio of the two numbers
an assertion compares, the numbers to one digit). It ships the signatures of the failures
that a test's *visible* part raises, the part a student can read and run, into
likely_bugs.json beside this module; nothing of the hidden tests is in it.

:func:`install` (called when ``distopt`` is imported in an IPython kernel) makes the kernel
show, under the traceback of a failed assertion whose message matches, the sentence that
names the mistake. The error's name and message are left as they are (the grader reads
those). ``DISTOPT_LIKELY_BUGS=0`` in the environment turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

TABLE = Path(__file__).with_name("likely_bugs.json")
MAX_CHARS = 1000  # of a message: the grader keeps the head of long ones
LEVELS = ("exact", "alike", "near")
MAX_TIED = 3  # mistakes named together where they fail exactly alike
NOTE = "Likely bug: this failure looks like"  # how the note under a traceback begins

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
    # a traceback's text (nbval's, `make check`'s) may end with this module's note: not the error's
    text = _TRACEBACK.sub("", str(message).split(NOTE, 1)[0][:MAX_CHARS])
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


_RANK_RAISED = re.compile(
    r"^launch: rank \d+ of \d+ raised (?:[\w.]*\.)?(\w+): (.*?)(?:\n\nTraceback of rank|\Z)", re.S
)
LAUNCH_ERRORS = ("LaunchError",)  # the launcher's report of an exception raised in a rank


def rank_error(ename: str, message: str) -> tuple[str, str]:
    """A rank's own error inside the launcher's report of it, else the error as given.

    A visible test that launches rank code fails with ``LaunchError("launch: rank 1 of 2
    raised AssertionError: ...")`` followed by the rank's traceback, whose paths and line
    numbers vary with the student's code: the mistake is in the rank's error alone."""
    if ename in LAUNCH_ERRORS:
        found = _RANK_RAISED.match(str(message))
        if found:
            return found.group(1), found.group(2)
    return ename, message


def signature(ename: str, message: str) -> Signature:
    """The signature of a failed test's error (its name and message; a rank's own error where
    the launcher reports one)."""
    ename, message = rank_error(ename, message)
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


# --- the notebook's note ----------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _cases(path: str) -> tuple[dict, ...]:
    try:
        tests = json.loads(Path(path).read_text(encoding="utf-8"))["tests"]
    except (OSError, ValueError, KeyError):
        return ()
    return tuple(c for cases in tests.values() for c in cases)


def named(ename: str, message: str, *, table: Path | None = None) -> tuple[str, list[str]]:
    """(level, the mistakes' words) of the catalogued failures a visible test's error looks
    like; ("", []) when none (or different mistakes match only roughly)."""
    sig = signature(ename, message)
    for level in LEVELS:
        key = sig.key(level)
        found = [c for c in _cases(str(table or TABLE)) if key is not None and c[level] == key]
        if found:
            labels = list(dict.fromkeys(c.get("hint") or c["name"] for c in found))
            if len(labels) == 1 or level == "exact" and len(labels) <= MAX_TIED:
                return level, labels
            return "", []
    return "", []


def note(ename: str, message: str, *, table: Path | None = None) -> str:
    """The sentence shown under a failed test's traceback, or "" when no mistake matches."""
    level, labels = named(ename, message, table=table)
    if not labels:
        return ""
    sure = {
        "exact": "it fails exactly as that one does",
        "alike": "its numbers are off as that one's are",
        "near": "it fails as that one does, its numbers about the same",
    }[level]
    what = "a typical mistake" if len(labels) == 1 else "one of these, which fail exactly alike"
    words = "; or ".join(label.rstrip(".") for label in labels)
    return f"{NOTE} {what}: {words} ({sure}; a likely cause, not a certainty)."


def _handler(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler: the usual traceback, the note under it. The kernel
    reports the error as ever (its name, message and status), the traceback with the note."""
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    try:
        said = note(etype.__name__, str(value))
    except Exception:  # the note is a courtesy: never let it hide the failure
        said = ""
    shell._showtraceback(etype, value, [*stb, "", said] if said else stb)


def install() -> bool:
    """Show the note under failed assertions in this IPython kernel, a rank's included (the
    launcher's LaunchError); False outside one."""
    if os.environ.get("DISTOPT_LIKELY_BUGS", "1") == "0":
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    from distopt.engine.launcher import LaunchError  # a rank's failed assertion, reported

    shell.set_custom_exc((AssertionError, LaunchError), _handler)
    return True
