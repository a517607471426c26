"""What the READMEs and the guides say holds, so that they cannot drift from the repository.

* CONTRIBUTING.md's frozen surface: every ``distopt`` name the released notebooks use (each
  name imported from the package, and each attribute used through such a name, read from
  every code cell of notebooks/*/*.ipynb with ``ast``) is listed there, and every name listed
  there still imports. Students keep their notebook all term: a name they use must not go.
* README.md's sections table: one row per section of notebooks/, its points the sum of the
  notebook's graded cells, its Run-All time autograder/section_costs.json; each section has
  its part in docs/sections.md.
* Every relative link of the READMEs and guides leads to a file, and to a heading there.
* Every ``make <target>`` they name is a target of the Makefile.
* The root README stays short enough to read in five minutes.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers import ROOT

NOTEBOOKS = sorted(ROOT.glob("notebooks/*/*.ipynb"))
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "autograder" / "README.md",
    ROOT / "coursehub" / "README.md",
    ROOT / "e2e" / "README.md",
]
ROOT_README_WORDS = 1500


def _section(text: str, heading: str, where: str) -> str:
    """The text under ``heading`` (a ``## `` line), up to the next such heading."""
    after = text.split(f"\n{heading}\n", 1)
    assert len(after) == 2, f"{where} has no '{heading}' section"
    return after[1].split("\n## ", 1)[0]


# --- the frozen surface -----------------------------------------------------------------------


def _code_cells(path: Path) -> list[str]:
    """The code cells' sources, IPython's ``%`` and ``!`` lines blanked (not Python)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    sources = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        lines = source.splitlines()
        sources.append("\n".join("" if ln.lstrip()[:1] in ("%", "!") else ln for ln in lines))
    return sources


def _is_distopt(module: str | None) -> bool:
    return module is not None and module.split(".")[0] == "distopt"


class _Uses(ast.NodeVisitor):
    """The ``distopt`` names one notebook uses, its cells visited in order.

    ``bound`` maps a name of the notebook to the package name it stands for (``comm`` ->
    ``distopt.costs.comm``); an import or an assignment that rebinds the name ends that, and a
    function's parameters hide it inside the function only."""

    def __init__(self, found: dict[str, set[str]], where: str) -> None:
        self.found = found
        self.where = where
        self.bound: dict[str, str] = {}

    def _use(self, name: str) -> None:
        self.found[name].add(self.where)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            local = alias.asname or alias.name
            if node.level == 0 and _is_distopt(node.module):
                self._use(f"{node.module}.{alias.name}")
                self.bound[local] = f"{node.module}.{alias.name}"
            else:
                self.bound.pop(local, None)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            local = alias.asname or alias.name.split(".")[0]
            if _is_distopt(alias.name):
                self._use(alias.name)
                self.bound[local] = alias.name if alias.asname else "distopt"
            else:
                self.bound.pop(local, None)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)  # `memory = memory.x(...)` reads the module first
        for target in node.targets:
            self.visit(target)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.bound.pop(node.id, None)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, value = [], node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.bound:
            self._use(".".join([self.bound[value.id], *reversed(chain)]))
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outside = dict(self.bound)
        for arg in ast.walk(node.args):
            if isinstance(arg, ast.arg):
                self.bound.pop(arg.arg, None)
        self.generic_visit(node)
        self.bound = outside
        self.bound.pop(node.name, None)

    visit_AsyncFunctionDef = visit_FunctionDef


def notebook_surface(paths: list[Path] = NOTEBOOKS) -> dict[str, set[str]]:
    """Every ``distopt`` name the notebooks use, with the notebooks that use it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        where = path.relative_to(ROOT).as_posix()
        uses = _Uses(found, where)
        for k, source in enumerate(_code_cells(path)):
            try:
                tree = ast.parse(source)
            except SyntaxError as error:
                pytest.fail(f"{where}: code cell {k} is not Python: {error}")
            uses.visit(tree)
    return found


def listed_surface() -> set[str]:
    """The names of CONTRIBUTING.md's frozen-surface block: each module and module.name.

    A line starts with a module and a colon, then its names; an indented line carries on the
    names of the line above."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    fenced = _section(text, "## The frozen surface", "CONTRIBUTING.md").split("```")
    assert len(fenced) >= 3, "CONTRIBUTING.md's '## The frozen surface' has no fenced block"
    listed, module = set(), None
    for line in fenced[1].splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            module, _, line = line.partition(":")
            listed.add(module.strip())
        assert module is not None, f"CONTRIBUTING.md: a continued line with no module: {line}"
        listed.update(f"{module.strip()}.{name}" for name in line.split())
    return listed


def _imports(name: str) -> bool:
    """Whether ``name`` (a module, or a module's attribute, or an attribute of that) exists."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise  # a module that exists failed to import one of its own
            continue
        break
    else:
        return False
    for attribute in parts[k:]:
        if not hasattr(obj, attribute):
            return False
        obj = getattr(obj, attribute)
    return True


def test_the_notebooks_are_found_and_use_the_package():
    assert len(NOTEBOOKS) >= 7, NOTEBOOKS
    assert len(notebook_surface()) > 100  # the parser still finds what the notebooks use


def test_every_name_the_notebooks_use_is_in_the_frozen_surface():
    listed = listed_surface()
    missing = {
        name: sorted(where) for name, where in notebook_surface().items() if name not in listed
    }
    assert not missing, (
        "names the released notebooks use, missing from CONTRIBUTING.md's frozen surface "
        "(add each under its module):\n"
        + "\n".join(f"  {name}  ({', '.join(where)})" for name, where in sorted(missing.items()))
    )


def test_every_name_of_the_frozen_surface_still_imports():
    gone = sorted(name for name in listed_surface() if not _imports(name))
    assert not gone, (
        "CONTRIBUTING.md's frozen surface lists names the package no longer has (a released "
        "notebook may use them: keep them until the term ends):\n  " + "\n  ".join(gone)
    )


def test_the_surface_parser_follows_rebinding():
    """A name rebound to another module (``checks``) is followed; a local shadow is not."""
    cells = [
        "from distopt.ranks import expert_checks as checks\nchecks.run_expert_parallel(f)",
        "from distopt.ranks import context_checks as checks\nchecks.assert_balanced(r)",
        "import distopt.project.diagnose\nx = distopt.project.diagnose.PROBLEMS",
        "def f(checks):\n    return checks.not_the_package",
        "checks = 3\nchecks.real",
    ]
    found: dict[str, set[str]] = defaultdict(set)
    uses = _Uses(found, "nb")
    for source in cells:
        uses.visit(ast.parse(source))
    assert set(found) == {
        "distopt.ranks.expert_checks",
        "distopt.ranks.expert_checks.run_expert_parallel",
        "distopt.ranks.context_checks",
        "distopt.ranks.context_checks.assert_balanced",
        "distopt.project.diagnose",
        "distopt.project.diagnose.PROBLEMS",
    }


# --- the sections table -----------------------------------------------------------------------


def _sections_table() -> dict[str, tuple[str, int, int]]:
    """README.md's sections table: section -> (topic, points, Run-All seconds)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = _section(text, "## Sections", "README.md")
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| (\d+) \| (\d+) s \|$", table, re.M)
    assert rows, "README.md's sections table has no rows like | `id` | topic | 28 | 24 s |"
    return {section: (topic, int(points), int(run_all)) for section, topic, points, run_all in rows}


def _graded_points(section: str) -> float:
    total = 0.0
    for path in sorted((ROOT / "notebooks" / section).glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            nbgrader = cell.get("metadata", {}).get("nbgrader", {})
            if nbgrader.get("grade"):
                total += nbgrader.get("points", 0)
    return total


def test_the_sections_table_has_one_row_per_section():
    sections = sorted({path.parent.name for path in NOTEBOOKS})
    assert sorted(_sections_table()) == sections


def test_the_sections_table_points_are_the_notebooks_graded_cells():
    table = {section: points for section, (_, points, _) in _sections_table().items()}
    graded = {section: _graded_points(section) for section in table}
    assert table == graded, (table, graded)


def test_the_sections_table_run_all_times_are_section_costs_json():
    costs = json.loads((ROOT / "autograder" / "section_costs.json").read_text())
    table = {section: run_all for section, (_, _, run_all) in _sections_table().items()}
    assert table == {s: c["run_all"] for s, c in costs.items()}, (table, costs)


def test_each_section_has_a_short_topic_and_its_part_in_docs_sections():
    text = (ROOT / "docs" / "sections.md").read_text(encoding="utf-8")
    for section, (topic, _, _) in _sections_table().items():
        assert len(topic) <= 80, f"README.md: {section}'s topic is longer than a line: {topic}"
        assert f"\n## {section}: " in text, f"docs/sections.md has no '## {section}: ...'"


# --- links, make targets, length --------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # no headings in code blocks
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(doc: Path):
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_make_target_the_docs_name_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):(?!=)", makefile, re.M))
    unknown = {
        f"{doc.relative_to(ROOT)}: make {name}"
        for doc in DOCS
        for name in re.findall(r"`make ([a-z][\w-]*)", doc.read_text(encoding="utf-8"))
        if name not in targets
    }
    assert not unknown, sorted(unknown)


def test_the_root_readme_reads_in_five_minutes():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words < ROOT_README_WORDS, (
        f"README.md has {words} words: move details to docs/ and keep it under {ROOT_README_WORDS}"
    )
