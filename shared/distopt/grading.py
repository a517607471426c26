"""Helpers for the notebooks' test cells.

Some exercises ask students to write a formula the package also holds, because a later
section builds on it. The tests must then check the student's own code, not the package's:
:func:`own_work` wraps the student's function so that a call fails with a clear message if
it reaches one of the package functions it is meant to re-create.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class NotYourOwnWork(AssertionError):
    """The student's function delegated the exercise to the package."""


def _message(fn: Callable, target: Callable) -> str:
    return (
        f"{fn.__name__} uses {target.__module__}.{target.__name__}, which already solves this "
        f"exercise. Write the computation yourself; the package version is for later sections."
    )


@contextmanager
def _forbidden(fn: Callable, targets: tuple[Callable, ...]) -> Iterator[None]:
    """Replace each target in its module by a function that fails, for the duration."""
    saved = []
    for target in targets:
        module = importlib.import_module(target.__module__)

        def refuse(*args: Any, _target: Callable = target, **kwargs: Any) -> Any:
            raise NotYourOwnWork(_message(fn, _target))

        saved.append((module, target.__name__, getattr(module, target.__name__)))
        setattr(module, target.__name__, refuse)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _referenced_objects(fn: Callable) -> list[Any]:
    try:
        closure = inspect.getclosurevars(fn)
    except TypeError:  # builtins and other non-Python callables have no code to inspect
        return []
    return [*closure.globals.values(), *closure.nonlocals.values()]


def own_work(fn: Callable, *targets: Callable) -> Callable:
    """Return ``fn`` wrapped so that calling it fails if it relies on any of ``targets``.

    Two checks: a name in ``fn``'s globals or closure bound to a target (as left by
    ``from distopt.costs.memory import training_state_bytes``), and a call that reaches a target
    through its module (``distopt.costs.memory.training_state_bytes(...)``).
    """
    for obj in _referenced_objects(fn):
        for target in targets:
            if obj is target:
                raise NotYourOwnWork(_message(fn, target))

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        with _forbidden(fn, targets):
            return fn(*args, **kwargs)

    return checked
