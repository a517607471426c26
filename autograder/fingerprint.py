"""The kernel's fingerprint: what the tests rely on, as seen from inside the student's kernel.

This module runs in the kernel, not in the grader: :func:`autograder.integrity.fingerprint_request`
sends its source text with a silent request, and the kernel runs it in a fresh namespace and
calls :func:`fingerprint` on its IPython shell. So it imports only the standard library, and
reads nothing from the autograder or from files (the sandboxed kernel cannot). The grader
compares the answers (:func:`autograder.integrity.differences`); tests import it as usual.
"""

import builtins
import importlib
import json
import sys
import types

# Modules whose callables are fingerprinted by identity from the first check on.
BASELINE_MODULES = (
    "builtins",
    "math",
    "cmath",
    "operator",
    "functools",
    "random",
    "numpy",
    "numpy.testing",
    "distopt.grading",
)
# Modules checked whenever loaded: none of their Python functions may come from the notebook.
PACKAGE_PREFIXES = ("distopt", "numpy", "math", "random", "torch.testing")
# Names of the notebook that IPython itself defines.
IPYTHON_NAMES = ("In", "Out", "exit", "quit", "get_ipython")


def fingerprint(shell) -> str:
    """The fingerprint of the kernel whose IPython shell is ``shell``, as JSON text.

    ``ids``: identity of each callable of :data:`BASELINE_MODULES`; ``modules``: identity of
    those modules; ``foreign``: functions of package modules defined outside the package;
    ``hooks``: IPython's transformers, exception handlers and methods; ``names``: what the
    notebook's names hold, where that could stand in for a module or a built-in.
    """
    ids, modules = _module_ids()
    return json.dumps(
        {
            "ids": ids,
            "modules": modules,
            "foreign": _foreign_functions(),
            "hooks": _hooks(shell),
            "names": _names(shell.user_ns),
        }
    )


def names_only(shell) -> str:
    """Only the ``names`` part of :func:`fingerprint`, as JSON text: what the grader asks
    after a cell that is not a test, where it only notes which names hold modules by now."""
    return json.dumps({"names": _names(shell.user_ns)})


def _module_ids() -> tuple[dict, dict]:
    ids, modules = {}, {}
    for name in BASELINE_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # not installed, or broken by the student: nothing to compare
            continue
        modules[name] = id(module)
        for attr, value in list(vars(module).items()):
            if callable(value) and not attr.startswith("__"):
                ids[f"{name}.{attr}"] = id(value)
    return ids, modules


def _foreign_functions() -> list[str]:
    """Python functions of package modules whose code lives outside the environment."""
    trusted = tuple(
        p for p in sys.path if p and ("site-packages" in p or p.startswith(sys.base_prefix))
    )
    submodules = tuple(p + "." for p in PACKAGE_PREFIXES)
    foreign = []
    for name, module in list(sys.modules.items()):
        # str.startswith with a tuple: sys.modules holds thousands of torch's modules
        watched = name in PACKAGE_PREFIXES or name.startswith(submodules)
        if module is None or not watched:
            continue
        root = (getattr(module, "__file__", "") or "").rsplit("/", 2)[0]
        if not root:
            continue
        allowed = (root, *trusted)
        for attr, value in list(vars(module).items()):
            # a function always has code; asking any other object for it could run its code
            if isinstance(value, types.FunctionType):
                if not value.__code__.co_filename.startswith(allowed):
                    foreign.append(f"{name}.{attr}")
    return foreign


def _hooks(shell) -> dict:
    hooks = {
        "input_transformers_cleanup": [id(t) for t in shell.input_transformers_cleanup],
        "input_transformers_post": [id(t) for t in shell.input_transformers_post],
        "ast_transformers": [id(t) for t in shell.ast_transformers],
        "custom_exceptions": repr(shell.custom_exceptions),
        "sys.excepthook": id(sys.excepthook),
        "sys.displayhook": id(sys.displayhook),
        "sys.gettrace": repr(sys.gettrace()),
        "sys.getprofile": repr(sys.getprofile()),
    }
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
    return hooks


def _names(user_ns: dict) -> dict:
    names = {}
    for name, value in list(user_ns.items()):
        if name.startswith("_") or name in IPYTHON_NAMES:
            continue
        if isinstance(value, types.ModuleType):
            genuine = sys.modules.get(value.__name__) is value
            names[name] = ("module:" if genuine else "fake module:") + value.__name__
        elif hasattr(builtins, name) and callable(value) and value is not getattr(builtins, name):
            names[name] = "shadows built-in:" + name
        elif (
            isinstance(value, (type, types.SimpleNamespace)) or type(value).__module__ == "__main__"
        ):
            names[name] = "object:"  # could stand in for a module
        else:
            names[name] = None
    return names
