"""How ``distopt.launch`` sends a rank its function: by value, with the notebook's source lines.

A function defined in a notebook cell cannot be imported by a child process, so it travels
by value with ``cloudpickle``. Two things are added so that a rank's traceback shows the
student's own lines: each code object keeps its real file name (cloudpickle would name it
"<dynamic-code>"), and ``cell_sources`` collects the lines IPython keeps for those cells in
``linecache``, which the rank puts into its own cache (:mod:`distopt.engine.rank`).
"""

from __future__ import annotations

import collections
import functools
import io
import linecache
import os
import pickle
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = ["cell_sources", "dumps"]


def cell_sources(fn: Callable[..., Any]) -> dict[str, list[str]]:
    """Source lines of the code ``fn`` runs that exist only in this process's ``linecache``.

    IPython registers each notebook cell there under a file name that is not on disk; a child
    process has no such entry, so its tracebacks would show file names without lines. This
    walks ``fn``, the functions it refers to (closure, globals, ``functools.partial``, the
    functions a wrapper object such as ``record.traced(fn)`` or a bench holds, and those in a
    tuple or list of them, e.g. the launch's arguments) and their nested code, and returns
    those cells' lines, to be put into the children's cache.
    """
    sources: dict[str, list[str]] = {}
    seen: set[int] = set()
    todo: list[Any] = [fn]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
            continue
        if isinstance(obj, (list, tuple)):  # the launch's arguments
            todo += list(obj)
            continue
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType):
            # a wrapper object (record.traced, link.linked) or a bench holding functions:
            # the callables among its attributes
            attributes = getattr(obj, "__dict__", None)
            if isinstance(attributes, dict) and not isinstance(obj, type):
                todo += [v for v in attributes.values() if callable(v) or isinstance(v, tuple)]
            continue
        names: set[str] = set()
        for inner in _code_objects(code):
            names.update(inner.co_names)
            filename = inner.co_filename
            if filename in linecache.cache and not os.path.exists(filename):
                sources[filename] = linecache.cache[filename][2]
        globals_ = getattr(obj, "__globals__", {})
        todo += [globals_[name] for name in names if callable(globals_.get(name))]
        todo += [cell.cell_contents for cell in (getattr(obj, "__closure__", None) or ())]
    return sources


class _CodeWithoutFilename:
    """Hands a code object to cloudpickle's own reducer (which names every file
    "<dynamic-code>"); ``_reduce_code`` puts the real file name back around it."""

    def __init__(self, code: types.CodeType) -> None:
        self.code = code

    def __reduce__(self):
        return cloudpickle.cloudpickle._code_reduce(self.code)


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


def _reduce_code(code: types.CodeType):
    return _with_filename, (_CodeWithoutFilename(code), code.co_filename)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, keeping each code object's file name: a rank's traceback then names the
    notebook cell, whose lines ``cell_sources`` ships, and shows them.

    A bench that ships by parts (``ships_by_parts``) found anywhere in what travels (a
    global or closure of the rank code, a container among the arguments) travels as
    :class:`~distopt.engine.own_parts.Withheld`: ``launch`` has already replaced the argument
    it cuts by each rank's own part, so any other copy would hand a rank the whole bench.
    """

    dispatch_table = collections.ChainMap(
        {types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table
    )

    def reducer_override(self, obj: Any) -> Any:
        if getattr(type(obj), "ships_by_parts", False) is True:
            from distopt.engine.own_parts import Withheld

            return Withheld, (type(obj).__name__,)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled with cloudpickle (by value where needed), code keeping its file names."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and every code object nested in it (inner functions, comprehensions)."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _code_objects(const)
    return found
