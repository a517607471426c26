"""Helpers for the notebooks' test cells.

Some exercises ask students to write a formula the package also holds, because a later
section builds on it. The tests must then check the student's own code, not the package's:
:func:`own_work` wraps the student's function so that a call fails with a clear message if
it reaches one of the package functions it is meant to re-create, however the student got
hold of it: imported by name, through its module, as a default argument, in a
``functools.partial``, a container, a bound method or a class, or from a second copy of the
module (``importlib.reload``, a fresh import from the file).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class NotYourOwnWork(AssertionError):
    """The student's function delegated the exercise to the package."""


def _message(fn: Callable, target: Callable) -> str:
    return (
        f"{fn.__name__} uses {target.__module__}.{target.__name__}, which already solves this "
        f"exercise. Write the computation yourself; the package version is for later sections."
    )


def _code_key(code: Any) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, code.co_qualname


def _codes(target: Any) -> list[Any]:
    """The code objects whose running means ``target`` runs (its methods, for a class)."""
    if isinstance(target, type):
        members = [vars(klass).values() for klass in target.__mro__ if klass is not object]
        found = []
        for member in (m for values in members for m in values):
            func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if isinstance(func, property):
                found += [f.__code__ for f in (func.fget, func.fset, func.fdel) if f is not None]
            elif hasattr(func, "__code__") and func.__module__ == target.__module__:
                found.append(func.__code__)
        return found
    code = getattr(inspect.unwrap(target), "__code__", None)
    return [] if code is None else [code]


class _Watch:
    """A profile hook that notices a forbidden function starting, by whatever route it came.

    Python calls the hook at every function call of the watched threads (``sys.setprofile``,
    and ``threading.setprofile`` for threads started meanwhile). A call of a target's code, or
    of a code object with its file, line and name (a reloaded copy of the module), raises
    NotYourOwnWork there; so does an attempt to switch profiling off, which would blind the
    watch. The first violation is kept: the wrapper raises it even if the student's code
    caught the exception (Python switches a hook off once it has raised).
    """

    def __init__(self, fn: Callable, targets: tuple[Callable, ...]):
        self.fn = fn
        self.trusted = {_given_call.__code__}  # calls made inside a given earlier answer
        self.by_code = {}
        self.by_key = {}
        for target in targets:
            for code in _codes(target):
                self.by_code[code] = target
                if not code.co_filename.startswith("<"):  # generated code shares its "<string>"
                    self.by_key[_code_key(code)] = target
        self.switches = {sys.setprofile} | {
            getattr(threading, name)
            for name in ("setprofile", "setprofile_all_threads")
            if hasattr(threading, name)
        }
        self.switch_codes = {f.__code__ for f in self.switches if hasattr(f, "__code__")}
        self.violation: NotYourOwnWork | None = None
        self.closing = False
        self.cleared: set[Any] = set()

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code in self.cleared or self.closing:
                return
            target = self.by_code.get(code) or self.by_key.get(_code_key(code))
            if target is not None:
                if _inside(frame.f_back, self.trusted):
                    return
                self.refuse(_message(self.fn, target))
            if code in self.switch_codes:
                self._refuse_switch()
            self.cleared.add(code)  # most calls repeat: look each code up once
        elif event == "c_call" and arg in self.switches and not self.closing:
            self._refuse_switch()

    def _refuse_switch(self) -> None:
        self.refuse(
            f"{self.fn.__name__} changes Python's profiling, which the test uses to see which "
            "functions the exercise calls. Remove that call."
        )

    def refuse(self, message: str) -> None:
        if self.violation is None:
            self.violation = NotYourOwnWork(message)
        raise NotYourOwnWork(message)

    @contextmanager
    def active(self) -> Iterator[None]:
        saved = sys.getprofile(), threading.getprofile()
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        try:
            yield
        finally:
            self.closing = True
            sys.setprofile(saved[0])
            threading.setprofile(saved[1])


@contextmanager
def _forbidden(watch: _Watch, targets: tuple[Callable, ...]) -> Iterator[None]:
    """Replace each target in its module by a function that fails, for the duration."""
    saved = []
    for target in targets:
        module = importlib.import_module(target.__module__)

        def refuse(*args: Any, _target: Callable = target, **kwargs: Any) -> Any:
            if _inside(sys._getframe(1), watch.trusted):
                return _target(*args, **kwargs)
            watch.refuse(_message(watch.fn, _target))

        saved.append((module, target.__name__, getattr(module, target.__name__)))
        setattr(module, target.__name__, refuse)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _inside(frame: Any, codes: set[Any]) -> bool:
    """Whether ``frame`` or a frame that called it runs one of ``codes``."""
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _given_call(reference: Callable, *args: Any, **kwargs: Any) -> Any:
    """An earlier answer given to a test (see :func:`own_work`): its calls are not checked."""
    return reference(*args, **kwargs)


def _with_given(fn: Callable, given: dict[str, Callable]) -> Callable:
    """A copy of ``fn`` whose global names in ``given`` call the given references instead."""
    if not given:
        return fn
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"given= needs a Python function, not {type(fn).__name__}")
    namespace = dict(fn.__globals__)
    namespace.update({name: functools.partial(_given_call, ref) for name, ref in given.items()})
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return functools.update_wrapper(copy, fn)


_DEPTH, _MAX_HELD = 3, 100_000  # how deep, and how many objects at most, the check looks


def _held(obj: Any) -> list[Any]:
    """What ``obj`` holds one level down: a partial's function and arguments, a container's
    items, a bound method's function, a class's attributes (not for the package's classes)."""
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, dict):
        return [*obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [*obj]
    if inspect.ismethod(obj):
        return [obj.__func__]
    if isinstance(obj, type) and not obj.__module__.startswith(("builtins", "distopt")):
        held = [*vars(obj).values()]
        return [*held, *(m.__func__ for m in held if isinstance(m, (staticmethod, classmethod)))]
    return []


def _referenced_objects(fn: Callable, skip: Iterable[str] = ()) -> list[Any]:
    """The objects ``fn`` can reach without a call: its globals, closure and defaults, and
    a few levels into what those hold (for targets without Python code, such as ``np.dot``,
    this is the only check that sees a reference kept in a default or a container)."""
    try:
        closure = inspect.getclosurevars(fn)
    except TypeError:  # builtins and other non-Python callables have no code to inspect
        return []
    skipped = set(skip)  # names a test hands the reference of (own_work's given=)
    found = [
        *(value for name, value in closure.globals.items() if name not in skipped),
        *closure.nonlocals.values(),
        *(getattr(fn, "__defaults__", None) or ()),
        *(getattr(fn, "__kwdefaults__", None) or {}).values(),
    ]
    level = found
    for _ in range(_DEPTH):
        level = [held for obj in level for held in _held(obj)][:_MAX_HELD]
        found += level
    return found


def own_work(
    fn: Callable, *targets: Callable, given: dict[str, Callable] | None = None
) -> Callable:
    """Return ``fn`` wrapped so that calling it fails if it relies on any of ``targets``.

    ``given`` maps the names of earlier answers that ``fn`` calls (``{"state_bytes_per_gpu":
    reference}``) to the reference versions the test hands it instead, so that a bug in an
    earlier exercise costs only that exercise's points. Inside a given reference, targets may
    run; a name the student reached another way is checked as before.

    Three checks: a name in ``fn``'s globals or closure bound to a target (as left by
    ``from distopt.costs.memory import training_state_bytes``), before any call; during the
    call, each target replaced in its module (``distopt.costs.memory.training_state_bytes(...)``,
    and targets without Python code such as ``np.dot``); and a profile hook that catches a
    target's code starting by any other route (see :class:`_Watch`). A target reached through
    another package function counts too: the exercise is to write the computation.
    """
    for obj in _referenced_objects(fn, skip=given or {}):
        for target in targets:
            if obj is target:
                raise NotYourOwnWork(_message(fn, target))
    run = _with_given(fn, given or {})

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        watch = _Watch(fn, targets)
        try:
            with _forbidden(watch, targets), watch.active():
                result = run(*args, **kwargs)
        except NotYourOwnWork:
            raise
        except BaseException:
            if watch.violation is None:
                raise
        if watch.violation is not None:  # raised inside, then caught by the student's code
            raise watch.violation
        return result

    return checked
