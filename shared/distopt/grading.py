"""Helpers for the notebooks' test cells.

Some exercises ask students to write a formula the package also holds, because a later
section builds on it. The tests must then check the student's own code, not the package's:
:func:`own_work` wraps the student's function so that a call fails with a clear message if
it reaches one of the package functions it is meant to re-create, however the student got
hold of it: imported by name, through its module, as a default argument, in a
``functools.partial``, a container, a bound method or a class, from a second copy of the
module (``importlib.reload``, a fresh import from the file), or as a copy of its source run
under another name (``exec(inspect.getsource(...))``: the same bytecode, constants and
names, for a target with a docstring or a long body). A target may also be a C function
(``math.hypot``, torch's fused optimizer kernels, see :func:`torch_fused_optimizer_ops`): a
call of it by any route is refused. A target may be a whole module (every function and class
in it, private ones included); a torch optimizer brings its module's private routes
(``torch.optim.adam._single_tensor_adam``, ...) along. A code object built from a target's
(``CodeType.replace`` with another name, line or docstring) is recognised by its body, and
one that claims a package file without being one of that file's own code objects is a copy.
"""

from __future__ import annotations

import dis
import functools
import inspect
import linecache
import os
import sys
import sysconfig
import threading
import tokenize
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class NotYourOwnWork(AssertionError):
    """The student's function delegated the exercise to the package."""


def _message(fn: Callable, target: Callable) -> str:
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", None)
    named = f"{module}.{name}" if module and name else repr(target)
    return (
        f"{fn.__name__} uses {named}, which already solves this exercise. Write the "
        f"computation yourself; the package version is for later sections."
    )


def _code_key(code: Any) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, code.co_qualname


Instruction = tuple[str, Any]
BodyKey = tuple[tuple[Instruction, ...], tuple[Any, ...], tuple[str, ...]]
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_BY_NAME = frozenset({"LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD"})
_PADDING = frozenset({"CACHE", "EXTENDED_ARG", "NOP"})


def _instructions(code: Any) -> tuple[Instruction, ...]:
    """``code``'s bytecode as the same source compiles anywhere: (operation, argument) pairs.

    ``co_code`` itself (the unspecialised bytecode; line numbers live in ``co_linetable``)
    depends on the compiled unit around a function: Python 3.11 calls ``math.ceil(x)`` with
    ``LOAD_GLOBAL (NULL + math); LOAD_ATTR ceil`` where the module imports ``math``, but with
    ``LOAD_GLOBAL math; LOAD_METHOD ceil`` in a copy compiled alone (``exec``), whose caches
    then shift every jump. So name loads keep only the name, LOAD_METHOD reads as LOAD_ATTR,
    jumps count instructions, not bytes, and caches, EXTENDED_ARG and NOP are left out.
    """
    kept: list[dis.Instruction] = []
    index: dict[int, int] = {}  # offset -> position among the kept (the next kept, if padding)
    for instruction in dis.get_instructions(code):
        index[instruction.offset] = len(kept)
        if instruction.opname not in _PADDING:
            kept.append(instruction)
    found: list[Instruction] = []
    for instruction in kept:
        name, arg = instruction.opname, instruction.arg
        if instruction.opcode in _JUMPS:
            arg = index.get(instruction.argval, -1)
        elif name in _BY_NAME:
            name, arg = ("LOAD_ATTR" if name == "LOAD_METHOD" else name), instruction.argval
        found.append((name, arg))
    return tuple(found)


def _constant_key(value: Any) -> Any:
    """A constant of a code object as :func:`_body_key` compares it: a nested function's code
    by its own body key, and each value with its type (``1``, ``1.0`` and ``True`` are equal
    as Python values, not as constants); ``repr`` tells ``-0.0`` from ``0.0`` and makes a
    ``nan`` equal to another."""
    if isinstance(value, types.CodeType):
        return _body_key(value)
    if isinstance(value, (tuple, frozenset)):
        return type(value), type(value)(_constant_key(v) for v in value)
    if value is None or value is Ellipsis or isinstance(value, (str, bytes, int)):
        return type(value), value
    return type(value), repr(value)


def _body_key(code: Any) -> BodyKey:
    """What a copy of a function's source shares with the original, whatever its name, file,
    first line or indentation: its bytecode (see :func:`_instructions`), its constants and
    the global and attribute names it looks up.

    Local names are not part of it (the bytecode numbers local variables), so renamed local
    variables do not hide a copy. A docstring (the first constant) counts as
    ``inspect.cleandoc`` leaves it: its lines are indented as deep as the copy is.
    """
    consts = [*code.co_consts]
    if consts and isinstance(consts[0], str):
        consts[0] = inspect.cleandoc(consts[0])
    return _instructions(code), tuple(_constant_key(c) for c in consts), code.co_names


def _bare_key(code: Any) -> BodyKey:
    """:func:`_body_key` without the docstring: what a copy keeps when ``CodeType.replace``
    gave it another name, line and docstring (``co_consts[0]`` set to None)."""
    instructions, consts, names = _body_key(code)
    if consts and consts[0][0] is str:
        consts = ((type(None), None), *consts[1:])
    return instructions, consts, names


# Files whose code is original, never a student's copy: the interpreter's and installed
# packages' (a trivial method of a target class, ``return self``, has many twins there), and
# this package's own (two of its helpers may be alike).
_ORIGINALS = (
    *{
        os.path.join(sysconfig.get_path(name), "")
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
    },
    os.path.join(os.path.dirname(os.path.abspath(__file__)), ""),
    "<frozen ",
)


_LONG = 100  # instructions: a body this long is not written twice, word for word, by chance
# Instructions from which a body stripped of its docstring still counts as a copy: the same
# bytecode, constants and global and attribute names over this many instructions is not
# written by chance (every reference answer and held-out mistake is shorter or differs).
_BARE_LONG = 40


def _distinctive(code: Any) -> bool:
    """Whether a target's body is one a student does not write by chance, so that an equal
    body is a copy: it has a docstring (a copy keeps it; the student's function has the
    notebook's, or none; in Python 3.11+ a function's first constant is its docstring or
    None), or it is long.

    The exercise is to write what the target computes, and a short computation has one
    natural spelling: section 03's reference answer ``CopyToTensorParallel`` has the very
    bytecode of the package's, ``forward``'s ``return x`` and ``backward``'s three lines
    alike. Such bodies are not keys.
    """
    has_docstring = bool(code.co_consts) and isinstance(code.co_consts[0], str)
    return has_docstring or len(_instructions(code)) >= _LONG


class _Bodies:
    """The forbidden targets' bodies, to recognise a copy of one (see :func:`_body_key`).

    Only the targets' own code (each method's, for a class) is a key, and only where it is
    distinctive (see :func:`_distinctive`), not the functions nested in it: a small lambda
    of the package's could well be the student's too. A short documented target could still
    equal a student's function that carries the same docstring; that is accepted, since a
    body and docstring equal to the target's are the target's, copied.
    """

    def __init__(self, targets: tuple[Callable, ...]):
        self.by_key: dict[BodyKey, Callable] = {}
        self.by_bare_key: dict[BodyKey, Callable] = {}  # long bodies, without docstrings
        for target in targets:
            for code in _codes(target):
                if _distinctive(code):
                    self.by_key[_body_key(code)] = target
                if len(_instructions(code)) >= _BARE_LONG:
                    self.by_bare_key[_bare_key(code)] = target
        # Names first: a lookup by the tuple a code object holds, where the key needs its
        # bytecode decoded. Few code objects share a target's names.
        self.names = {key[2] for key in [*self.by_key, *self.by_bare_key]}

    def target(self, code: Any) -> Callable | None:
        """The target whose body ``code`` is a copy of, if any."""
        if code.co_names not in self.names or code.co_filename.startswith(_ORIGINALS):
            return None
        found = self.by_key.get(_body_key(code))
        if found is None and not _compiled_from_its_file(code):
            found = self.by_bare_key.get(_bare_key(code))
        return found


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
                # A decorated method's own code, not its wrapper's: a wrapper's code (torch's
                # ``_disable_dynamo``, say) is shared by every function it decorates.
                code = getattr(inspect.unwrap(func), "__code__", None)
                found += [code] if code is not None else []
        return found
    code = getattr(inspect.unwrap(target), "__code__", None)
    return [] if code is None else [code]


def _c_functions(target: Any) -> list[Any]:
    """The C functions whose call means ``target`` runs: a builtin target itself, or the one
    a torch operator (``torch.ops.aten._fused_adamw_``, an overload of it) calls."""
    if isinstance(target, types.BuiltinFunctionType):
        return [target]
    if isinstance(target, (type, types.FunctionType)):
        return []
    op = getattr(target, "_op", None)  # torch's OpOverloadPacket and OpOverload
    return [op] if isinstance(op, types.BuiltinFunctionType) else []


_SWITCH = object()  # what :class:`_Watch` maps the functions that switch profiling to


def _switches() -> set[Any]:
    """The functions that switch profiling (the watch) off: threading's own, not the guard's
    wrapper around them inside a rank (:mod:`distopt.engine.guard`), whose code every wrapper
    of the guard's shares."""
    return {sys.setprofile} | {
        inspect.unwrap(getattr(threading, name))
        for name in ("setprofile", "setprofile_all_threads")
        if hasattr(threading, name)
    }


# torch.optim's modules whose functions are not one optimizer's routes: a target there (the
# base class ``torch.optim.Optimizer``) does not bring the module's functions along.
_SHARED_OPTIM_MODULES = frozenset(
    {"torch.optim.optimizer", "torch.optim.lr_scheduler", "torch.optim.swa_utils"}
)


def _defined_in(module: types.ModuleType) -> list[Any]:
    """The functions and classes ``module`` defines (not those it imports), private included."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, (types.FunctionType, type))
        and getattr(value, "__module__", None) == module.__name__
    ]


def _private_helpers(target: Any) -> list[Any]:
    """The private functions of a package function's module that it calls by name, and
    theirs in turn (``run_federated``'s ``_minibatch``): part of the target, never meant for
    a student's own code."""
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    if module is None or not module.__name__.startswith("distopt."):
        return []
    found: dict[int, Any] = {}
    todo = [target]
    while todo:
        for code in _codes(todo.pop()):
            for name in {n for c in _all_codes(code) for n in c.co_names}:
                helper = vars(module).get(name)
                if (
                    name.startswith("_")
                    and not name.startswith("__")
                    and isinstance(helper, types.FunctionType)
                    and helper.__module__ == module.__name__
                    and id(helper) not in found
                ):
                    found[id(helper)] = helper
                    todo.append(helper)
    return list(found.values())


def _expanded(targets: tuple[Any, ...]) -> tuple[Any, ...]:
    """The targets with what each stands for: a module, every function and class it defines;
    a package function or class, the private helpers of its module it calls
    (:func:`_private_helpers`); a torch optimizer (``torch.optim.Adam``,
    ``torch.optim.adam.adam``), its module's private routes too (``_single_tensor_adam``,
    ``_multi_tensor_adam``, ``_fused_adam``), which run the same update without the public
    name."""
    found: dict[int, Any] = {}
    for target in targets:
        if isinstance(target, types.ModuleType):
            found.update((id(t), t) for t in _defined_in(target))
            continue
        found[id(target)] = target
        found.update((id(t), t) for t in _private_helpers(target))
        home = getattr(target, "__module__", None) or ""
        if home.startswith("torch.optim.") and home not in _SHARED_OPTIM_MODULES:
            module = sys.modules.get(home)
            if module is not None:
                found.update(
                    (id(t), t) for t in _defined_in(module) if isinstance(t, types.FunctionType)
                )
    return tuple(found.values())


def _all_codes(code: Any) -> Iterator[Any]:
    """``code`` and the code objects nested in it (functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_codes(const)


_OWN_CODES: dict[tuple[str, float], frozenset[tuple[int, str]]] = {}


def _own_codes(filename: str) -> frozenset[tuple[int, str]]:
    """(first line, qualified name) of every code object of the source file ``filename``, as
    compiled from the file now and as loaded in this process (a module loaded before the
    file changed): what a code object claiming that file must be one of."""
    try:
        mtime = os.path.getmtime(filename)
    except OSError:
        mtime = -1.0
    key = (filename, mtime)
    if key not in _OWN_CODES:
        found: set[tuple[int, str]] = set()
        try:
            with tokenize.open(filename) as source:
                compiled = compile(source.read(), filename, "exec", dont_inherit=True)
            found |= {(c.co_firstlineno, c.co_qualname) for c in _all_codes(compiled)}
        except (OSError, SyntaxError, ValueError):
            pass
        for module in list(sys.modules.values()):
            if getattr(module, "__file__", None) == filename:
                for value in _defined_in(module):
                    for code in _codes(value):
                        found |= {(c.co_firstlineno, c.co_qualname) for c in _all_codes(code)}
        _OWN_CODES[key] = frozenset(found)
    return _OWN_CODES[key]


def _compiled_from_its_file(code: Any) -> bool:
    """Whether ``code``'s own source file (a notebook cell's included: the kernel and the
    launched ranks keep their lines in :mod:`linecache`) defines a function of its name at
    its first line (past decorators): code compiled from what the student typed, not a code
    object given another name, line or file (``CodeType.replace``).

    An answer retyped from the package's source is the former: its docstring, if it kept the
    package's, makes it a copy (:func:`_body_key`); without, it is left to a person."""
    name = code.co_name
    for number in range(code.co_firstlineno, code.co_firstlineno + 50):
        line = linecache.getline(code.co_filename, number).strip()
        if not line:
            return False  # no source (a file of nothing, or past its end)
        if line.startswith(("@", "#")):
            continue
        if name == "<lambda>":
            return "lambda" in line
        words = line.replace("(", " ").replace(":", " ").split()
        while words and words[0] == "async":
            words = words[1:]
        return len(words) >= 2 and words[0] in ("def", "class") and words[1] == name
    return False


def _forged(code: Any) -> bool:
    """Whether ``code`` claims a source file it is not one of the code objects of: made by
    ``CodeType.replace`` (another name or line) from one of that file's functions."""
    filename = code.co_filename
    if filename.startswith("<") or not os.path.isabs(filename):
        return False
    return (code.co_firstlineno, code.co_qualname) not in _own_codes(filename)


class _Targets:
    """What :func:`own_work` works out once about its targets, for the watch of every call."""

    def __init__(self, targets: tuple[Callable, ...]):
        targets = _expanded(targets)
        self.targets = targets
        self.bodies = _Bodies(targets)
        self.by_code: dict[Any, Callable] = {}
        self.by_key: dict[tuple[str, int, str], Callable] = {}
        for target in targets:
            for code in _codes(target):
                self.by_code[code] = target
                if not code.co_filename.startswith("<"):  # generated code shares its "<string>"
                    self.by_key[_code_key(code)] = target
        self.by_c_function = {c: target for target in targets for c in _c_functions(target)}
        self.homes = [(target, home) for target in targets if (home := _home(target))]
        # The targets' source files: a code object claiming one of them that is not one of
        # its own is a copy of its code (see :func:`_forged`).
        self.by_file: dict[str, list[tuple[Any, Callable]]] = {}
        for target in targets:
            for code in _codes(target):
                if os.path.isabs(code.co_filename):
                    self.by_file.setdefault(code.co_filename, []).append((code, target))

    def of(self, obj: Any) -> Callable | None:
        """The target whose code the Python function ``obj`` runs a copy of, if any."""
        if not isinstance(obj, types.FunctionType):
            return None
        try:
            obj = inspect.unwrap(obj)  # a copy under a decorator (``@torch.no_grad()``)
        except ValueError:  # a cycle of __wrapped__
            pass
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType) or code in self.by_code:
            return None  # a target itself is found by identity, not as a copy
        return self.copied(code)

    def copied(self, code: Any) -> Callable | None:
        """The target whose code ``code`` copies, by body or by a forged file, if any."""
        target = self.bodies.target(code)
        if target is not None:
            return target
        if code.co_filename in self.by_file and _forged(code):
            # Named after the target it copies (by body, docstring aside), else the file's
            # first target.
            found = self.by_file[code.co_filename]
            bare = _bare_key(code)
            return next((t for c, t in found if _bare_key(c) == bare), found[0][1])
        if code.co_names in self.bodies.names and code.co_filename.startswith(_ORIGINALS):
            # A package or torch file's body equal to a target's: the target's twin there,
            # or a copy given that file's name; only the latter is not the file's own.
            twin = self.bodies.by_key.get(_body_key(code)) or self.bodies.by_bare_key.get(
                _bare_key(code)
            )
            if twin is not None and _forged(code):
                return twin
        return None


class _Watch:
    """A profile hook that notices a forbidden function starting, by whatever route it came.

    Python calls the hook at every function call of the watched threads (``sys.setprofile``,
    and ``threading.setprofile`` for threads started meanwhile). A call of a target's code, of
    a code object with its file, line and name (a reloaded copy of the module), of one with
    its body (a copy of the source, see :class:`_Bodies`), or of a C function target
    (a ``c_call`` event; builtins compare equal when bound to the same object, so a fresh
    bound method per attribute access still matches) raises NotYourOwnWork there; so does an
    attempt to switch profiling off, which would blind the watch. The first violation is kept:
    the wrapper raises it even if the student's code caught the exception (Python switches a
    hook off once it has raised).
    """

    def __init__(self, fn: Callable, known: _Targets, given: Iterable[Callable] = ()):
        self.fn = fn
        # Calls made inside a given earlier answer: a frame of _given_call whose reference is
        # one the test gave (by identity). _given_call itself is reachable by anyone; what it
        # is handed decides.
        self.given_ids = {id(reference) for reference in given}
        self.known = known
        self.by_code = known.by_code
        self.by_key = known.by_key
        self.switches = _switches()
        self.switch_codes = {f.__code__ for f in self.switches if hasattr(f, "__code__")}
        # The C functions a c_call event is checked against, in one dict (one lookup per
        # builtin call): the switches, and the C functions the targets run.
        self.c_watched: dict[Any, Any] = dict.fromkeys(self.switches, _SWITCH)
        self.c_watched.update(known.by_c_function)
        self.violation: NotYourOwnWork | None = None
        self.closing = False
        self.cleared: set[Any] = set()

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code in self.cleared or self.closing:
                return
            target = (
                self.by_code.get(code)
                or self.by_key.get(_code_key(code))
                or self.known.copied(code)
            )
            if target is not None:
                if self.in_given(frame.f_back):
                    return
                self.refuse(_message(self.fn, target))
            if code in self.switch_codes:
                self._refuse_switch()
            self.cleared.add(code)  # most calls repeat: look each code up once
        elif event == "c_call" and not self.closing:
            try:
                target = self.c_watched.get(arg)
            except TypeError:  # not hashable: no builtin function, so none of ours
                return
            if target is _SWITCH:
                self._refuse_switch()
            elif target is not None and not self.in_given(frame):
                self.refuse(_message(self.fn, target))

    def in_given(self, frame: Any) -> bool:
        """Whether ``frame`` or a frame that called it runs a reference the test gave."""
        while frame is not None:
            if (
                frame.f_code is _given_call.__code__
                and id(frame.f_locals.get("reference")) in self.given_ids
            ):
                return True
            frame = frame.f_back
        return False

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


Home = tuple[types.ModuleType, str]


def _home(target: Any) -> Home | None:
    """The loaded module and name a target is reached by (``torch``, ``"_fused_adamw_"``),
    or None where ``__module__`` names no loaded module holding it (torch's operators report
    ``torch._ops.aten``, a bound builtin None): the profile hook alone watches those."""
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    name = getattr(target, "__name__", None)
    if module is None or not isinstance(name, str):
        return None
    held = getattr(module, name, None)
    same = held is target or (isinstance(held, types.BuiltinFunctionType) and held == target)
    return (module, name) if same else None


@contextmanager
def _forbidden(watch: _Watch, homes: list[tuple[Callable, Home]]) -> Iterator[None]:
    """Replace each target in its module (see :func:`_home`) by a function that fails, for
    the duration."""
    saved = []
    try:
        for target, (module, name) in homes:

            def refuse(*args: Any, _target: Callable = target, **kwargs: Any) -> Any:
                if watch.in_given(sys._getframe(1)):
                    return _target(*args, **kwargs)
                watch.refuse(_message(watch.fn, _target))

            saved.append((module, name, getattr(module, name)))
            setattr(module, name, refuse)
        yield
    finally:
        for module, name, original in reversed(saved):  # a target listed twice: the first
            setattr(module, name, original)


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
    ``from distopt.costs.memory import training_state_bytes``) or to a copy of one (a function
    with a target's body, see :class:`_Bodies`), and ``fn`` itself being such a copy, before
    any call; during the call, each target replaced in its module
    (``distopt.costs.memory.training_state_bytes(...)``, ``np.dot``, ``torch._fused_adamw_``);
    and a profile hook that catches a target's code, a copy of it, or a C function target
    starting by any other route (see :class:`_Watch`). A target reached through another
    package function counts too: the exercise is to write the computation.

    A target is a Python function, a class (each of its methods counts), a C function
    (``builtin_function_or_method``: ``math.hypot``, ``torch._fused_adamw_``), a torch
    operator (``torch.ops.aten._fused_adamw_`` and its overloads) or another callable such as
    ``np.dot`` (seen only by name, before and during the call), or a module: every function
    and class it defines, private ones included (``distopt.project.diagnose``: its
    ``_diverged`` and ``_has_spike`` as much as ``diagnose``). A package target brings the
    private helpers of its module that it calls along (``run_federated``: ``_minibatch``), a
    torch optimizer its module's functions (``torch.optim.Adam``: ``_single_tensor_adam``,
    ``_multi_tensor_adam``, ...). :func:`torch_fused_optimizer_ops` lists torch's fused
    optimizer kernels.

    A copy of a target is caught by its body (:class:`_Bodies`; a long one even without its
    docstring, as ``CodeType.replace`` leaves it under another name and line), and a code
    object claiming a target's file without being one of that file's own code objects is a
    copy (:func:`_forged`).
    """
    known = _Targets(targets)
    for obj in [fn, *_referenced_objects(fn, skip=given or {})]:
        for target in known.targets:
            if obj is target:
                raise NotYourOwnWork(_message(fn, target))
        copied = known.of(obj)
        if copied is not None:
            raise NotYourOwnWork(_message(fn, copied))
    run = _with_given(fn, given or {})

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        watch = _Watch(fn, known, (given or {}).values())
        try:
            with _forbidden(watch, known.homes), watch.active():
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


def torch_fused_optimizer_ops() -> tuple[Any, ...]:
    """torch's fused optimizer kernels, as targets for an optimizer exercise's own_work.

    ``torch._fused_adam_`` and its kin (AdamW, SGD, Adagrad: those this torch has) update
    tensors in one C call, which ``torch.optim`` makes for ``fused=True``; a student can call
    one on tensors made from the exercise's arrays. Listed with them: the same operators in
    ``torch.ops.aten`` (in place and functional) and each overload. ``torch._foreach_*`` are
    not listed: they are elementwise arithmetic, the student's own computation. torch is
    imported here, not with this module, which sections without torch use too.
    """
    import torch

    found: list[Any] = []
    for kind in ("adam", "adamw", "sgd", "adagrad"):
        for name in (f"_fused_{kind}_", f"_fused_{kind}"):  # in place, and functional
            if hasattr(torch, name):
                found.append(getattr(torch, name))
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None:
                found += [packet, *(getattr(packet, o) for o in packet.overloads())]
    return tuple(found)
