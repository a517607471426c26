"""Cells that only show, left out when grading (issue 55).

A course author tags a reference cell ``show-only`` when it draws, sweeps, demonstrates or
measures and no test reads what it makes. When a submission is graded, such a cell is not run
if, and only if, all of these hold:

- its source is, line for line, the released cell's (:func:`marked`): the tag is read from the
  release, never from the submission, and a cell the student changed runs as written;
- no cell that does run loads a name it assigns (:func:`plan`, to a fixed point: a cell kept
  for its names may itself need others). Every cell that runs is read, wherever it stands,
  since a function defined early may read a name assigned later;
- no cell that runs reaches names it does not write out (``globals()``, ``eval``, ``exec``,
  ``In``/``Out``, IPython's history names, or code IPython cannot turn into Python): then
  every cell runs.

What a cell changes in place (an object's attribute, a random generator's state, a file) is not
seen by reading names: that is the author's to get right, and ``tests/repo/test_show_only.py``
checks it on every section, grading the reference, the blank notebook and the catalogue's
mistakes both ways and comparing every test's outcome and score.

Students run every cell in JupyterLab; a skipped cell's place in the graded notebook and on the
feedback page carries the note of :class:`autograder.outcomes.ShowOnly` instead of its output.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import nbformat

TAG = "show-only"  # the reference cell's tag (in metadata.tags) that marks it

# Names through which a cell reaches the notebook's others without writing them out: with
# any of them in a cell that runs, reading names proves nothing and nothing is skipped.
# (``vars(obj)``, ``exec(code, namespace)``: an object's own names, not the notebook's.)
_DYNAMIC = frozenset(
    {"In", "Out", "_ih", "_oh", "_dh", "_i", "_ii", "_iii", "_", "__", "___"}  # IPython's history
    | {"get_ipython", "__builtins__", "__main__"}
)
_NAMESPACE_CALLS = {"globals": 0, "locals": 0, "vars": 0, "dir": 0, "eval": 1, "exec": 1}
_HISTORY = re.compile(r"_i?\d+$")  # IPython's _5, _i5
_SAFE_MAGIC = re.compile(r"^\s*%matplotlib\s+inline\s*$", re.MULTILINE)  # changes no name


def digest(source: str) -> str:
    """A cell's source, whitespace at line ends and at the end ignored, as a short digest."""
    text = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def is_marked(cell) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


@lru_cache(maxsize=64)
def _marked_in(path: str, mtime_ns: int) -> frozenset[str]:
    nb = nbformat.read(path, as_version=4)
    return frozenset(digest(c.source) for c in nb.cells if is_marked(c))


def marked(released: Path | str) -> frozenset[str]:
    """Digests of the cells tagged show-only in the released notebook at ``released`` (none
    if it is not there)."""
    path = Path(released)
    try:
        return _marked_in(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError):
        return frozenset()


class Names:
    """What a cell reads and assigns in the notebook's namespace, by name.

    ``stores``: every name the cell may bind at the top level (in any branch, by any form of
    binding) or through ``global`` in a function. ``reads_before``: names its top-level code
    reads before a definite top-level assignment of its own (so they come from earlier
    cells). ``reads_any_time``: names its functions, lambdas and classes read from the
    namespace, whenever they are called (so from any cell, earlier or later).
    """

    def __init__(self, source: str):
        self.stores: set[str] = set()
        self.reads_before: set[str] = set()
        self.reads_any_time: set[str] = set()
        self.imports: dict[str, str] = {}  # name -> the import statement that binds it
        self.dynamic = False
        code = _python(source)
        if code is None:
            self.dynamic = True  # unreadable: it may reach anything
            return
        self._block(code.body, set())
        self._imports(code)
        self.dynamic = _reaches_namespace(code, self.reads_before | self.reads_any_time)

    def _read(self, node, assigned: set[str]) -> None:
        """Names ``node`` (an expression or a simple statement) reads, given those the cell
        has surely assigned by then."""
        if node is None:
            return
        reads = _Reads()
        reads.visit(node)
        self.reads_before |= reads.now - assigned
        self.reads_any_time |= reads.later
        self.stores |= _binds([node]) | reads.global_stores

    def _block(self, statements: list, assigned: set[str]) -> set[str]:
        """Walk ``statements`` in order; the names surely assigned after them."""
        assigned = set(assigned)
        for statement in statements:
            assigned = self._statement(statement, assigned)
        return assigned

    def _statement(self, node, assigned: set[str]) -> set[str]:
        block = self._block
        if isinstance(node, ast.For | ast.AsyncFor):
            self._read(node.iter, assigned)
            self._read(node.target, assigned)
            block(node.body, assigned | _binds([node.target]))
            block(node.orelse, assigned)
            return assigned
        if isinstance(node, ast.While):
            self._read(node.test, assigned)
            block(node.body, assigned)
            block(node.orelse, assigned)
            return assigned
        if isinstance(node, ast.If):
            self._read(node.test, assigned)
            return assigned | (block(node.body, assigned) & block(node.orelse, assigned))
        if isinstance(node, ast.With | ast.AsyncWith):
            inside = set(assigned)
            for item in node.items:
                self._read(item.context_expr, inside)
                if item.optional_vars is not None:
                    self._read(item.optional_vars, inside)
                    inside |= _binds([item.optional_vars])
            return block(node.body, inside)
        if isinstance(node, ast.Try | ast.TryStar):
            block(node.body, assigned)
            for handler in node.handlers:
                self._read(handler.type, assigned)
                self.stores |= {handler.name} if handler.name else set()
                block(handler.body, assigned | ({handler.name} if handler.name else set()))
            block(node.orelse, assigned)
            return block(node.finalbody, assigned)
        if isinstance(node, ast.Match):
            self._read(node.subject, assigned)
            for case in node.cases:
                bound = _binds([case.pattern])
                self.stores |= bound
                self._read(case.guard, assigned | bound)
                block(case.body, assigned | bound)
            return assigned
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self.reads_before |= {node.target.id} - assigned  # `x += 1` reads x first
        self._read(node, assigned)
        return assigned | _binds([node]) if isinstance(node, _DEFINITE) else assigned

    def _imports(self, code: ast.Module) -> None:
        others = _binds([n for n in code.body if not isinstance(n, ast.Import | ast.ImportFrom)])
        for node in code.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    name = (alias.asname or alias.name).split(".")[0]
                    if name in others:  # bound another way too: not only an import
                        continue
                    self.imports[name] = ast.unparse(type(node)(**{**vars(node), "names": [alias]}))


# top-level statements after which the names they bind are the cell's own
_DEFINITE = (
    ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.FunctionDef,
    ast.AsyncFunctionDef, ast.ClassDef,
)  # fmt: skip
_COMPREHENSION = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _binds(nodes) -> set[str]:
    """Names bound in the scope of ``nodes`` (not in functions, classes or comprehensions
    they hold, except by ``:=``, which binds here from a comprehension too)."""
    names: set[str] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.NamedExpr):
            names.add(node.target.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            todo += node.decorator_list  # (their bodies bind their own names)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, _COMPREHENSION):
            todo += [n for n in ast.walk(node) if isinstance(n, ast.NamedExpr)]
            continue
        todo += ast.iter_child_nodes(node)
    return names


class _Reads(ast.NodeVisitor):
    """Names a statement reads from the namespace: ``now`` as it runs, ``later`` when the
    functions, lambdas and classes it defines are called (or their bodies run)."""

    def __init__(self):
        self.now: set[str] = set()
        self.later: set[str] = set()
        self.global_stores: set[str] = set()
        self._bound: list[set[str]] = []
        self._deferred = 0

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and not any(node.id in b for b in self._bound):
            (self.later if self._deferred else self.now).add(node.id)

    def _scope(self, parameters: set[str], body: list) -> None:
        declared = {
            name
            for n in ast.walk(ast.Module(body=body, type_ignores=[]))
            if isinstance(n, ast.Global)
            for name in n.names
        }
        bound = _binds(body)
        self.global_stores |= bound & declared
        self._bound.append((parameters | bound) - declared)
        self._deferred += 1
        for statement in body:
            self.visit(statement)
        self._deferred -= 1
        self._bound.pop()

    def _function(self, node) -> None:
        args = node.args
        for now in [*getattr(node, "decorator_list", []), *args.defaults, *args.kw_defaults]:
            if now is not None:
                self.visit(now)
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        parameters = {a.arg for a in every if a is not None}
        body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
        self._scope(parameters, body)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for now in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(now)
        self._scope(set(), node.body)  # read as if called later: more, never fewer

    def _comprehension(self, node) -> None:
        generators = node.generators
        self.visit(generators[0].iter)  # evaluated where the comprehension stands
        targets = {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        self._bound.append(targets)
        for g in generators:
            if g is not generators[0]:
                self.visit(g.iter)
            for condition in g.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if getattr(node, part, None) is not None:
                self.visit(getattr(node, part))
        self._bound.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension


def _reaches_namespace(code: ast.Module, loads: set[str]) -> bool:
    """Whether ``code`` may reach the notebook's names without writing them out: IPython's
    history, ``globals()``, ``eval(text)`` (in the caller's namespace), ``__main__``."""
    if loads & _DYNAMIC or any(map(_HISTORY.match, loads)):
        return True
    for node in ast.walk(code):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            most = _NAMESPACE_CALLS.get(node.func.id)
            if most is not None and len(node.args) <= most and not node.keywords:
                return True
        if isinstance(node, ast.alias) and node.name == "__main__":
            return True
        if isinstance(node, ast.Constant) and node.value == "__main__":
            return True  # sys.modules["__main__"] (and the odd `__name__ == "__main__"`)
    return False


def needed_after_all(nb) -> bool:
    """Whether an autograded notebook in which show-only cells were left out has an error
    that names what one of them binds (``NameError: name 'x'``, ``KeyError: 'x'``, ``module
    '__main__' has no attribute 'x'``): the student's code reached it by a route names do
    not show, and the submission is graded again running every cell."""
    from autograder import outcomes

    left_out = [
        c for c in nb.cells if any(isinstance(o, outcomes.ShowOnly) for o in outcomes.recorded(c))
    ]
    if not left_out:
        return False
    bound = set().union(*(names_of(c.source).stores for c in left_out))
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                missing = _MISSING_NAME.get(output.get("ename", ""))
                found = missing.fullmatch(output.get("evalue", "").strip()) if missing else None
                if found and found.group(1) in bound:
                    return True
    return False


# the errors that say a name was not there, and where they say which (a message that only
# quotes a name, e.g. a dict in an assertion's message, says nothing of the kind)
_MISSING_NAME = {
    "NameError": re.compile(r"name '([A-Za-z_]\w*)' is not defined"),
    "KeyError": re.compile(r"'([A-Za-z_]\w*)'"),
    "AttributeError": re.compile(r"module '__main__' has no attribute '([A-Za-z_]\w*)'"),
}


@lru_cache(maxsize=4096)
def names_of(source: str) -> Names:
    """:class:`Names` of a cell's source, kept for the worker's life (read, never changed):
    the cells of a section repeat from one submission to the next."""
    return Names(source)


def _python(source: str) -> ast.Module | None:
    """The cell as Python (IPython's magics turned into calls), or None if it is not."""
    text = _SAFE_MAGIC.sub("", source)
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        text = TransformerManager().transform_cell(text)
        return ast.parse(text)
    except Exception:  # a syntax error, a transform IPython refuses: unreadable
        return None


def plan(
    sources: Sequence[str | None], marked_digests: Iterable[str], always: Iterable[int] = ()
) -> set[int]:
    """Which of a notebook's code cells to skip: indexes into ``sources`` (None for a cell
    that is not code). The cells at ``always`` (answers, tests) run whatever their source."""
    wanted, fixed = frozenset(marked_digests), frozenset(always)
    names = [None if s is None else names_of(s) for s in sources]
    skip = {
        i for i, s in enumerate(sources) if s is not None and i not in fixed and digest(s) in wanted
    }
    while skip:
        running = [n for i, n in enumerate(names) if n is not None and i not in skip]
        if any(n.dynamic for n in running):
            return set()
        kept = {i for i in skip if _readers(i, names, skip)}
        if not kept:
            break
        skip -= kept
    return skip


def _readers(i: int, names: list[Names | None], skip: set[int]) -> dict[int, set[str]]:
    """The cells that run (not in ``skip``, not ``i``) and the names of cell ``i`` each
    reads: at the top level after it, or from a function whenever it is called. (Importing
    again what a running cell before it imported the same way binds nothing new: the same
    module object.)"""
    cell = names[i]
    again = {
        name
        for name, statement in cell.imports.items()
        if any(
            names[k] is not None and k not in skip and names[k].imports.get(name) == statement
            for k in range(i)
        )
    }
    stores = cell.stores - again
    found = {}
    for j, other in enumerate(names):
        if other is None or j in skip or j == i:
            continue
        read = stores & (other.reads_any_time | (other.reads_before if j > i else set()))
        if read:
            found[j] = read
    return found


def plan_notebook(nb, marked_digests: Iterable[str]) -> set[int]:
    """:func:`plan` over a notebook's cells (indexes into ``nb.cells``): only plain code cells
    (no nbgrader role) can be skipped; answers and tests always run."""
    sources = [c.source if c.get("cell_type") == "code" else None for c in nb.cells]
    always = [i for i, c in enumerate(nb.cells) if _graded_role(c)]
    return plan(sources, marked_digests, always)


def _graded_role(cell) -> bool:
    """An answer, a test, or any other cell nbgrader grades or marks as a task."""
    from autograder import course

    meta = cell.get("metadata", {}).get("nbgrader", {})
    return course.is_answer(cell) or bool(meta.get("grade") or meta.get("task"))


def why_needed(nb, i: int, skip: set[int]) -> list[str]:
    """For the author: which running cells read which names cell ``i`` binds."""
    names = [names_of(c.source) if c.get("cell_type") == "code" else None for c in nb.cells]
    return [
        f"cell {j + 1} reads {', '.join(sorted(read))}"
        for j, read in _readers(i, names, skip).items()
    ]


def suggest(section: str) -> list[str]:
    """Lines for the author: the plain cells after the first answer of each reference
    notebook of ``section`` that grading could leave out, and why the others run."""
    from autograder import course

    lines = []
    for name in course.section_notebooks(section):
        nb = nbformat.read(course.SOLUTIONS / section / f"{name}.ipynb", as_version=4)
        first = next((i for i, c in enumerate(nb.cells) if course.is_answer(c)), len(nb.cells))
        plain = [
            i
            for i, c in enumerate(nb.cells)
            if c.get("cell_type") == "code" and i > first and not _graded_role(c)
        ]
        skip = plan_notebook(nb, {digest(nb.cells[i].source) for i in plain})
        for i in plain:
            tagged = is_marked(nb.cells[i])
            head = nb.cells[i].source.strip().splitlines()[0][:60] if nb.cells[i].source else ""
            if i in skip:
                verdict = "tagged" if tagged else "could be tagged"
            else:
                why = "; ".join(why_needed(nb, i, skip)) or "a cell that runs reaches any name"
                verdict = ("TAGGED BUT NEEDED: " if tagged else "runs: ") + why
            lines.append(f"{section}/{name} cell {i + 1}: {verdict}  | {head}")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    from autograder import course

    parser = argparse.ArgumentParser(description="Which cells grading may leave out.")
    parser.add_argument("sections", nargs="*", help="section ids (default: all)")
    args = parser.parse_args(argv)
    for section in args.sections or course.sections():
        print("\n".join(suggest(section)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
