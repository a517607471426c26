"""Catch student code that tampers with what the tests rely on, before and after each test.

The hidden tests run in the student's kernel, next to the student's code, so a student cell
can try to make them pass: ``np.allclose = lambda *a, **k: True``, ``math.isclose = ...``,
replacing ``distopt.grading.own_work``, patching ``builtins``, defining ``all`` or
``AssertionError`` in the notebook, an IPython input transformer that empties every later
cell, a custom exception handler or a patched ``showtraceback`` that swallows the error.

The grader (:class:`autograder.nbgrader_plugins.ExecuteUntilKernelDeath`) asks the kernel for
a *fingerprint* once before the first cell and again before and after every graded test
cell, over a silent request whose answer the student's cells cannot see. The grader, outside
the kernel, compares each fingerprint with the first one (:func:`differences`); a test cell
run in a tampered kernel scores 0 and the report names what was changed.

What it is not: proof against a student who studies this file and writes code to forge the
fingerprint (the kernel is the student's process). Such code has to be written on purpose and
stays in the submission for the instructor to read; :func:`suspicious_lines` lists the lines
that touch these internals, for the report.
"""

from __future__ import annotations

import ast
import json
import re

# Modules whose attributes are fingerprinted by identity from the first check on.
BASELINE_MODULES = [
    "builtins",
    "math",
    "cmath",
    "operator",
    "functools",
    "random",
    "numpy",
    "numpy.testing",
    "distopt.grading",
]
# Modules checked whenever loaded: none of their Python functions may come from the notebook.
PACKAGE_PREFIXES = ["distopt", "numpy", "math", "random", "torch.testing"]

# Runs in the kernel (silently). Returns the fingerprint as JSON text.
FINGERPRINT_SOURCE = r"""
def __autograder_fingerprint__(baseline_modules, package_prefixes):
    import builtins, importlib, json, sys, types

    fp = {"ids": {}, "foreign": [], "hooks": {}, "names": {}, "modules": {}}
    for name in baseline_modules:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        fp["modules"][name] = id(module)
        for attr, value in list(vars(module).items()):
            if callable(value) and not attr.startswith("__"):
                fp["ids"][f"{name}.{attr}"] = id(value)
    # Python functions in package modules must be defined in files of the environment.
    trusted = tuple(
        p for p in sys.path if p and ("site-packages" in p or p.startswith(sys.base_prefix))
    )
    for name, module in list(sys.modules.items()):
        watched = any(name == p or name.startswith(p + ".") for p in package_prefixes)
        if module is None or not watched:
            continue
        root = (getattr(module, "__file__", "") or "").rsplit("/", 2)[0]
        if not root:
            continue
        for attr, value in list(vars(module).items()):
            code = getattr(value, "__code__", None)
            if isinstance(value, types.FunctionType) and code is not None:
                path = code.co_filename
                if not (path.startswith(root) or path.startswith(trusted)):
                    fp["foreign"].append(f"{name}.{attr}")
    shell = get_ipython()
    hooks = fp["hooks"]
    hooks["input_transformers_cleanup"] = [id(t) for t in shell.input_transformers_cleanup]
    hooks["input_transformers_post"] = [id(t) for t in shell.input_transformers_post]
    hooks["ast_transformers"] = [id(t) for t in shell.ast_transformers]
    hooks["custom_exceptions"] = repr(shell.custom_exceptions)
    hooks["sys.excepthook"] = id(sys.excepthook)
    hooks["sys.displayhook"] = id(sys.displayhook)
    hooks["sys.gettrace"] = repr(sys.gettrace())
    hooks["sys.getprofile"] = repr(sys.getprofile())
    kernel = getattr(shell, "kernel", None)
    objects = {
        "shell": shell,
        "shell.display_pub": getattr(shell, "display_pub", None),
        "shell.displayhook": getattr(shell, "displayhook", None),
        "kernel": kernel,
        "kernel.session": getattr(kernel, "session", None),
    }
    for label, obj in objects.items():
        if obj is None:
            continue
        hooks[label] = id(obj)
        for attr in dir(type(obj)):
            if attr.startswith("__"):
                continue
            value = getattr(type(obj), attr, None)
            if isinstance(value, types.FunctionType):
                overridden = attr in getattr(obj, "__dict__", {})
                hooks[f"{label}.{attr}"] = -1 if overridden else id(value)
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or name in ("In", "Out", "exit", "quit", "get_ipython"):
            continue
        if isinstance(value, types.ModuleType):
            genuine = sys.modules.get(value.__name__) is value
            fp["names"][name] = ("module:" if genuine else "fake module:") + value.__name__
        elif hasattr(builtins, name) and callable(value) and value is not getattr(builtins, name):
            fp["names"][name] = "shadows built-in:" + name
        elif (
            isinstance(value, (type, types.SimpleNamespace))
            or type(value).__module__ == "__main__"
        ):
            fp["names"][name] = "object:"  # could stand in for a module
        else:
            fp["names"][name] = None
    return json.dumps(fp)
"""


def fingerprint_request() -> tuple[str, str]:
    """(code, user expression) of the silent request that returns the fingerprint.

    Everything is in the expression, which IPython evaluates without its input
    transformers: a transformer that empties cells cannot empty the check.
    """
    expression = (
        "(lambda ns: (exec(" + repr(FINGERPRINT_SOURCE) + ", ns),"
        f" ns['__autograder_fingerprint__']({BASELINE_MODULES!r}, {PACKAGE_PREFIXES!r}))[1])"
        "({'get_ipython': get_ipython})"
    )
    return "", expression


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
