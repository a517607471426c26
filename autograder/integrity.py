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
import builtins
import functools
import json
import re
from pathlib import Path

from autograder import course, fingerprint, strays

# The kernel-side modules, sent as text: the kernel runs each in a namespace of its own.
FINGERPRINT_SOURCE = Path(fingerprint.__file__).read_text(encoding="utf-8")
STRAYS_SOURCE = Path(strays.__file__).read_text(encoding="utf-8")


def fingerprint_request() -> tuple[str, str]:
    """(code, user expression) of the silent request that returns the fingerprint.

    Everything is in the expression, which IPython evaluates without its input
    transformers: a transformer that empties cells cannot empty the check. The expression
    runs :mod:`autograder.fingerprint` from its source and calls ``fingerprint`` on the shell.
    """
    return "", _call_in_kernel(FINGERPRINT_SOURCE, "fingerprint", "get_ipython()", "fingerprint")


def _call_in_kernel(source: str, function: str, argument: str, namespace: str) -> str:
    """The user expression that runs ``source`` in a fresh namespace of the kernel (named
    ``__autograder_<namespace>__``) and calls its ``function`` on ``argument`` (an expression
    the kernel evaluates): the request's answer is that call's value."""
    return (
        f"(lambda ns: (exec({source!r}, ns), ns[{function!r}]({argument}))[1])"
        f"({{'__name__': '__autograder_{namespace}__'}})"
    )


def names_request() -> str:
    """The user expression of the light request after a cell that is not a test: only the
    notebook's names (:func:`autograder.fingerprint.names_only`), half the cost of a whole
    fingerprint, for :func:`note_modules`."""
    return _call_in_kernel(FINGERPRINT_SOURCE, "names_only", "get_ipython()", "fingerprint")


def note_modules(now: dict | None, seen_modules: dict[str, str]) -> bool:
    """Note in ``seen_modules`` which names of the notebook hold a genuine module by now, from
    a reply to :func:`names_request` (parsed by :func:`parse_reply`) as :func:`differences`
    notes them; False if the reply is missing or unreadable."""
    names = now.get("names") if isinstance(now, dict) else None
    if not isinstance(names, dict):
        return False
    for name, value in names.items():
        kind, _, what = str(value).partition(":")
        if value is not None and kind == "module":
            seen_modules[name] = what
    return True


def strays_request(whole_uid: bool) -> str:
    """The user expression of the silent request that ends the processes a failed cell left
    running (:func:`autograder.strays.end_strays`); its value is how many it ended."""
    return _call_in_kernel(STRAYS_SOURCE, "end_strays", repr(bool(whole_uid)), "strays")


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
    baseline: dict,
    now: dict | None,
    seen_modules: dict[str, str],
    test_names: set[str],
    shown: set[str] = frozenset(),
) -> list[str]:
    """What the student's code changed since the baseline, in words (empty: nothing).

    ``seen_modules`` maps notebook names once bound to a genuine module (``np``, ``math``) to
    that module's name; it is updated here, and a later rebinding of such a name to an object
    that can stand in for a module (a class, an instance of a notebook class) is reported.
    A notebook function named like a built-in is reported if the tests use that name
    (``test_names``): ``def filter(signal)`` in a notebook whose tests never call ``filter``
    is not tampering.

    The words are a fixed vocabulary: everything in ``now`` was written by the kernel, which
    the student's code controls (a module's ``__name__``, a notebook name, a key of
    ``sys.modules`` can be any text, e.g. hidden test lines in base64), so a name is quoted
    only where it is one the grader knows already (:func:`quotable`: the baseline's, taken
    before any student code ran, the package's own, the built-ins, or ``shown``, the
    identifiers of the visible tests), and said as "a name of the notebook" otherwise.
    """
    if now is None:
        return ["the integrity check got no answer from the kernel"]
    shapes = {"modules": dict, "ids": dict, "foreign": list, "hooks": dict, "names": dict}
    if not isinstance(now, dict) or not all(isinstance(now.get(k), t) for k, t in shapes.items()):
        return ["the integrity check got an answer it cannot read (a forged fingerprint)"]
    known = _vocabulary() | set(shown)
    found = []
    for key, value in baseline["modules"].items():
        if now["modules"].get(key) != value:
            module = _quoted(key, known | _parts(*fingerprint.BASELINE_MODULES), "of the tests")
            found.append(f"the module {module} was replaced in sys.modules")
    replaced = sorted(k for k, v in baseline["ids"].items() if now["ids"].get(k, v) != v)
    found += [f"{_quoted(key, known | _parts(key), 'a function')} was replaced" for key in replaced]
    foreign = sorted(set(map(str, now["foreign"])) - set(replaced))
    named = [key for key in foreign if quotable(key, known | _parts(*baseline["ids"]))]
    found += [f"{key} was replaced by notebook code" for key in named]
    if len(foreign) > len(named):
        many = len(foreign) - len(named)
        found.append(_count(many, "function", "s") + " of package modules defined by notebook code")
    for key, value in baseline["hooks"].items():
        if now["hooks"].get(key) != value:
            found.append(f"the kernel's {_quoted(key, _parts(*baseline['hooks']), 'hook')} "
                         "was changed")  # fmt: skip
    unnamed = {"fake module": 0, "stand-in": 0}
    for name, value in sorted(now["names"].items(), key=lambda item: str(item[0])):
        if value is None or value == baseline["names"].get(name, ""):
            continue  # plain data, or there before any student code ran (ipykernel's ``open``)
        kind, _, what = str(value).partition(":")
        if kind == "fake module":
            if quotable(name, known):
                found.append(f"the notebook's name {name!r} is a fake module")
            else:
                unnamed["fake module"] += 1
        elif kind == "shadows built-in" and name in test_names | ALWAYS_RELEVANT:
            if quotable(name, BUILTIN_NAMES):
                found.append(f"the notebook's name {name!r} is a function shadowing the built-in")
        elif kind == "object" and name in seen_modules:
            module = _quoted(seen_modules[name], known, "it held")
            if quotable(name, known):
                found.append(f"the name {name!r} no longer refers to the module {module}")
            else:
                unnamed["stand-in"] += 1
        elif kind == "module":
            seen_modules[name] = what
    if unnamed["fake module"]:
        found.append(_count(unnamed["fake module"], "name", "s") + " of the notebook: fake modules")
    if unnamed["stand-in"]:
        found.append(
            _count(unnamed["stand-in"], "name", "s")
            + " of the notebook: no longer the modules held"
        )
    return [change[:CHANGE_CHARS] for change in found]


CHANGE_CHARS = 120  # the longest change said (a quoted name is at most NAME_CHARS)
NAME_CHARS = 60
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def quotable(name: object, known: set[str]) -> bool:
    """Whether ``name`` may be quoted in a report: a (dotted) identifier of at most
    :data:`NAME_CHARS` characters whose every part is in ``known``."""
    return (
        isinstance(name, str)
        and len(name) <= NAME_CHARS
        and _DOTTED.fullmatch(name) is not None
        and all(part in known for part in name.split("."))
    )


def _quoted(name: object, known: set[str], otherwise: str) -> str:
    return str(name) if quotable(name, known) else f"({otherwise})"


def _parts(*keys: str) -> set[str]:
    return {part for key in keys if isinstance(key, str) for part in key.split(".")}


def _count(n: int, noun: str, plural: str) -> str:
    return f"{n} {noun}{plural if n != 1 else ''}"


BUILTIN_NAMES = frozenset(dir(builtins))


@functools.cache
def _vocabulary() -> frozenset[str]:
    """The names the grader may quote whatever the kernel says: the fingerprint's modules,
    and every module, function and class name of the course package (read from its files)."""
    import importlib.util

    words = _parts(*fingerprint.BASELINE_MODULES, *fingerprint.PACKAGE_PREFIXES)
    spec = importlib.util.find_spec("distopt")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in Path(folder).rglob("*.py"):
            words.update(path.relative_to(folder).with_suffix("").parts)
            text = path.read_text(encoding="utf-8", errors="replace")
            words.update(re.findall(r"^\s*(?:def|class)\s+([A-Za-z_]\w*)", text, re.MULTILINE))
    return frozenset(words)


def visible_names(sources: list[str]) -> set[str]:
    """The identifiers of ``sources`` (test cells) outside their hidden regions: what a
    report may quote of a notebook's names (a student sees these in the released notebook)."""
    return names_used([_HIDDEN.sub("", source) for source in sources])


_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?(^[ \t]*### END HIDDEN TESTS[^\n]*$|\Z)",
                     re.MULTILINE | re.DOTALL)  # fmt: skip


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


# --- answers a person should read (issue 53, item 7) -----------------------------------------
#
# What a grade cannot prove: an answer cell that reaches into the course's objects or the
# interpreter may pass every test and still not do the exercise (or defeat a check the tests
# did not think of). Such lines are listed for the instructor, whatever the answer scored, by a
# static scan of the graded answer cells' syntax (nothing runs).

REVIEW_KINDS = {
    "private": "a private attribute",
    "frames": "frames or the collector",
    "processes": "a child process",
    "code": "code objects or dynamic code",
    "hooks": "saved-tensor hooks",
    "recorder": "the recorder",
    "meter": "the meter",
}
_CALLS = {  # dotted names (as written, after import aliases) -> kind
    "sys._getframe": "frames", "sys._current_frames": "frames",
    "inspect.currentframe": "frames", "inspect.stack": "frames", "inspect.trace": "frames",
    "inspect.getouterframes": "frames", "inspect.getinnerframes": "frames",
    "inspect.getframeinfo": "frames", "traceback.walk_stack": "frames",
    "traceback.extract_stack": "frames", "gc.get_objects": "frames",
    "gc.get_referrers": "frames", "gc.get_referents": "frames",
    "os.system": "processes", "os.popen": "processes", "os.fork": "processes",
    "os.forkpty": "processes", "os.posix_spawn": "processes", "os.posix_spawnp": "processes",
    "concurrent.futures.ProcessPoolExecutor": "processes",
    "types.CodeType": "code", "types.FunctionType": "code", "types.LambdaType": "code",
    "compile": "code", "exec": "code", "eval": "code", "__import__": "code",
    "importlib.reload": "code", "marshal.loads": "code",
}  # fmt: skip
_PREFIXES = {  # any use of these modules (or os.exec*/os.spawn*) -> kind
    "subprocess": "processes", "multiprocessing": "processes", "pty": "processes",
    "os.exec": "processes", "os.spawn": "processes", "ctypes": "code", "marshal": "code",
    "distopt.engine.record": "recorder", "torch.multiprocessing": "processes",
}  # fmt: skip
_ATTRIBUTES = {  # attribute names, on any object -> kind
    "f_back": "frames", "f_locals": "frames", "f_globals": "frames", "f_code": "frames",
    "tb_frame": "frames", "gi_frame": "frames", "cr_frame": "frames",
    "__code__": "code", "__globals__": "code", "__closure__": "code", "__defaults__": "code",
    "__kwdefaults__": "code", "__builtins__": "code",
    "saved_tensors_hooks": "hooks", "save_on_cpu": "hooks", "register_saved_tensors_hooks": "hooks",
    "__dict__": "private",
}  # fmt: skip
_RECORDER_NAMES = {"record", "recorder", "Recording", "communication", "traced", "run_traced",
                   "wrap_collective"}  # fmt: skip
_PRIVATE_CALLS = {"getattr", "setattr", "delattr", "hasattr", "vars", "object.__getattribute__",
                  "object.__setattr__"}  # fmt: skip


# The meters of the course's benches (distopt.ranks: ``Meter``, ``full_weight_meter``,
# ``ActivationMeter``) and what holds one (``bench.meter``, ``meter.peak``): a word of its own,
# not "parameters".
_METER = re.compile(r"(?:^|_)meter(?:$|_)|Meter")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a name or attribute chain, None for anything else (``f().x``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Names bound by imports -> the dotted module or object they stand for."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _resolved(dotted: str, aliases: dict[str, str]) -> str:
    head, _, rest = dotted.partition(".")
    return aliases.get(head, head) + (f".{rest}" if rest else "")


def _kind_of(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """Which of :data:`REVIEW_KINDS` this node is, if any: the named routes first (so that
    ``sys._getframe`` is a frame, not a private attribute), then attribute names."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [f"{node.module}.{a.name}" for a in node.names if node.module]
        )
        for name in names:
            for prefix, kind in _PREFIXES.items():
                if name == prefix or name.startswith(prefix + "."):
                    return kind
            if name.split(".")[-1] in _ATTRIBUTES:
                return _ATTRIBUTES[name.split(".")[-1]]
        return None
    dotted = _dotted(node) if isinstance(node, ast.Attribute | ast.Name) else None
    if dotted is not None:
        full = _resolved(dotted, aliases)
        if full in _CALLS:
            return _CALLS[full]
        for prefix, kind in _PREFIXES.items():
            if full == prefix or full.startswith(prefix + "."):
                return kind
        if full.startswith("distopt.") and full.split(".")[-1] in _RECORDER_NAMES:
            return "recorder"
        if full in _PUBLIC_UNDERSCORED:
            return None
    if isinstance(node, ast.Attribute):
        if node.attr in _ATTRIBUTES:
            return _ATTRIBUTES[node.attr]
        base = node.value
        if (
            node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(base, ast.Name) and base.id in ("self", "cls"))
        ):
            return "private"
        if _METER.search(node.attr):
            return "meter"
    if isinstance(node, ast.Name) and _METER.search(node.id):
        return "meter"
    if isinstance(node, ast.Call):
        called = _dotted(node.func)
        text = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if called == "vars" and node.args:
            return "private"  # every attribute of an object, private ones included
        if called in _PRIVATE_CALLS and any(
            isinstance(t, str) and t.startswith("_") and not t.startswith("__") for t in text
        ):
            return "private"
    return None


# Public names that start with an underscore (the standard library's documented API).
_PUBLIC_UNDERSCORED = frozenset({"os._exit", "sys._xoptions", "collections.namedtuple._make"})


def review_lines(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, the stripped line) of each line of an answer cell's ``source`` that a
    person should read (:data:`REVIEW_KINDS`), in order, once per line."""
    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    aliases = _aliases(tree)
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        kind = _kind_of(node, aliases)
        line = getattr(node, "lineno", None)
        if kind is not None and line is not None and line not in found:
            found[line] = kind
    lines = code.splitlines()
    return [(n, found[n], lines[n - 1].strip()) for n in sorted(found)]


REVIEW_WORDS = "needs a person's review"


def needs_review(nb, limit: int = 5) -> str | None:
    """The note on a notebook whose graded answer cells have lines a person should read
    (:func:`review_lines`), e.g. ``needs a person's review: cell 4 (fsdp_step) line 7, a
    private attribute: `bench._shards[1]```; None when there is none. The lines are the
    student's own, as handed in (not anything their code printed), each cut to 100
    characters; at most ``limit`` are quoted."""
    hits = []
    for index, cell in enumerate(nb.cells):
        if not course.is_answer(cell):
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        for line, kind, text in review_lines(cell.get("source", "")):
            where = f"cell {index + 1} ({str(meta.get('grade_id', ''))[:60]}) line {line}"
            hits.append(f"{where}, {REVIEW_KINDS[kind]}: `{text[:100].replace('`', chr(39))}`")
    if not hits:
        return None
    more = f" (and {len(hits) - limit} more)" if len(hits) > limit else ""
    return f"{REVIEW_WORDS}: " + "; ".join(hits[:limit]) + more
