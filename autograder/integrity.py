"""Catch student code that tampers with what the tests rely on, before and after each test.

The hidden tests run in the student's kernel, next to the student's code, so a student cell
can try to make them pass: ``np.allclose = lambda *a, **k: True``, ``math.isclose = ...``,
replacing ``distopt.grading.own_work``, patching ``builtins``, defining ``all`` or
``AssertionError`` in the notebook, an IPython input transformer that empties every later
cell, a custom exception handler or a patched ``showtraceback`` that swallows the error.

The grader (:class:`autograder.nbgrader_plugins.ExecuteUntilKernelDeath`) asks the kernel for
a *fingerprint* once before the first cell and again before and after every graded test
cell, over a silent request whose answer the student's cells cannot see: the source text of
:mod:`autograder.fingerprint`, run in the kernel. The grader, outside the kernel, compares
each fingerprint with the first one (:func:`differences`); a test cell run in a tampered
kernel scores 0 and the report names what was changed.

What it is not: proof against a student who studies this file and writes code to forge the
fingerprint (the kernel is the student's process). Such code has to be written on purpose and
stays in the submission for the instructor to read; :func:`suspicious_lines` lists the lines
that touch these internals, for the report.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from autograder import fingerprint, strays

# The kernel-side modules, sent as text: the kernel runs each in a namespace of its own.
FINGERPRINT_SOURCE = Path(fingerprint.__file__).read_text(encoding="utf-8")
STRAYS_SOURCE = Path(strays.__file__).read_text(encoding="utf-8")


def fingerprint_request() -> tuple[str, str]:
    """(code, user expression) of the silent request that returns the fingerprint.

    Everything is in the expression, which IPython evaluates without its input
    transformers: a transformer that empties cells cannot empty the check. The expression
    runs :mod:`autograder.fingerprint` from its source and calls ``fingerprint`` on the shell.
    """
    expression = (
        "(lambda ns: (exec(" + repr(FINGERPRINT_SOURCE) + ", ns),"
        " ns['fingerprint'](get_ipython()))[1])({'__name__': '__autograder_fingerprint__'})"
    )
    return "", expression


def strays_request(whole_uid: bool) -> str:
    """The user expression of the silent request that ends the processes a failed cell left
    running (:func:`autograder.strays.end_strays`); its value is how many it ended."""
    return (
        "(lambda ns: (exec(" + repr(STRAYS_SOURCE) + ", ns),"
        f" ns['end_strays']({bool(whole_uid)!r}))[1])({{'__name__': '__autograder_strays__'}})"
    )


def parse_reply(content: dict) -> dict | None:
    """The fingerprint from an execute_reply's content, or None if it is not there."""
    result = content.get("user_expressions", {}).get("fp", {})
    if result.get("status") != "ok":
        return None
    try:
        return json.loads(ast.literal_eval(result["data"]["text/plain"]))
    except (KeyError, ValueError, SyntaxError, TypeError):
        return None


def differences(
    baseline: dict, now: dict | None, seen_modules: dict[str, str], test_names: set[str]
) -> list[str]:
    """What the student's code changed since the baseline, in words (empty: nothing).

    ``seen_modules`` maps notebook names once bound to a genuine module (``np``, ``math``) to
    that module's name; it is updated here, and a later rebinding of such a name to an object
    that can stand in for a module (a class, an instance of a notebook class) is reported.
    A notebook function named like a built-in is reported if the tests use that name
    (``test_names``): ``def filter(signal)`` in a notebook whose tests never call ``filter``
    is not tampering.
    """
    if now is None:
        return ["the integrity check got no answer from the kernel"]
    found = []
    for key, value in baseline["modules"].items():
        if now["modules"].get(key) != value:
            found.append(f"the module {key} was replaced in sys.modules")
    replaced = sorted(k for k, v in baseline["ids"].items() if now["ids"].get(k, v) != v)
    found += [f"{key} was replaced" for key in replaced]
    foreign = sorted(set(now["foreign"]) - set(replaced))
    found += [f"{key} was replaced by notebook code" for key in foreign]
    for key, value in baseline["hooks"].items():
        if now["hooks"].get(key) != value:
            found.append(f"the kernel's {key} was changed")
    for name, value in sorted(now["names"].items()):
        if value is None or value == baseline["names"].get(name, ""):
            continue  # plain data, or there before any student code ran (ipykernel's ``open``)
        kind, _, what = value.partition(":")
        if kind == "fake module":
            found.append(f"the notebook's name {name!r} is a fake module {what}")
        elif kind == "shadows built-in" and name in test_names | ALWAYS_RELEVANT:
            found.append(f"the notebook's name {name!r} is a function shadowing the built-in")
        elif kind == "object" and name in seen_modules:
            found.append(f"the name {name!r} no longer refers to the module {seen_modules[name]}")
        elif kind == "module":
            seen_modules[name] = what
    return found


# Built-in names whose redefinition is reported even if no test names them.
ALWAYS_RELEVANT = {"AssertionError", "Exception", "BaseException"}


def names_used(sources: list[str]) -> set[str]:
    """Every identifier in ``sources`` (the test cells), for :func:`differences`."""
    return {word for source in sources for word in re.findall(r"[A-Za-z_]\w*", source)}


# Lines of student code that reach into these internals: for the instructor to read.
_SUSPICIOUS = re.compile(
    r"\b(builtins|__builtins__|get_ipython|sys\.modules|sys\.settrace|sys\.setprofile|"
    r"excepthook|displayhook|input_transformers|ast_transformers|set_custom_exc|"
    r"showtraceback|__code__|ctypes|gc\.get_referrers|setattr\s*\(\s*(np|numpy|math|distopt))\b"
    r"|^\s*(np|numpy|math|distopt(\.\w+)*|memory|comm)\.\w+\s*=[^=]"
)


def suspicious_lines(sources: list[str], limit: int = 3) -> list[str]:
    """Up to ``limit`` stripped lines of ``sources`` that patch modules or the kernel."""
    hits = []
    for source in sources:
        for line in source.splitlines():
            if _SUSPICIOUS.search(line) and not line.lstrip().startswith("#"):
                hits.append(line.strip()[:100])
                if len(hits) >= limit:
                    return hits
    return hits
