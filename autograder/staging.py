"""Private, cleaned copies of submissions: what nbgrader grades instead of the student's files.

The student's folder is never changed. The copy under ``autograder/.work/submitted/`` holds
only the section's notebooks, repaired where nbgrader would otherwise fail or be fooled:

* nbgrader metadata a student stripped is put back, matched by cell id from the released
  notebook (nbgrader then restores the test cells as usual);
* a graded cell that appears twice keeps its metadata on the first copy only (nbgrader
  refuses duplicate ids), and a graded cell from another notebook or section (a grade id
  this notebook does not have) becomes an ordinary cell;
* extra files (a ``numpy.py`` that would shadow numpy, data, anything) are not copied;
* a notebook handed in under another name is graded if it is the only candidate and holds
  cells of this notebook;
* lines of the student's own code that reach into modules or the kernel (``np.x = ...``,
  ``get_ipython()``, ``builtins``, ``sys.modules``) are quoted "for review".

Each repair is reported in words (``notes``) for the grades report.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import course, integrity


@dataclass
class Staged:
    """The notebooks staged for one student and section, and what was done to them."""

    graded: list[str] = field(default_factory=list)  # notebook names staged for grading
    notes: list[str] = field(default_factory=list)  # repairs, in words


def grade_ids(nb: nbformat.NotebookNode) -> list[str]:
    return [
        c.metadata["nbgrader"]["grade_id"]
        for c in nb.cells
        if "grade_id" in c.metadata.get("nbgrader", {})
    ]


def find_renamed(folder: Path, notebook: str, released: nbformat.NotebookNode) -> Path | None:
    """The one other ``.ipynb`` in ``folder`` that holds cells of ``notebook``, if any."""
    others = [p for p in sorted(folder.glob("*.ipynb")) if p.stem != notebook]
    if len(others) != 1:
        return None
    try:
        candidate = nbformat.read(others[0], as_version=4)
    except Exception:
        return None
    ids = {c.get("id") for c in released.cells}
    shared = set(grade_ids(candidate)) & set(grade_ids(released))
    return others[0] if shared or ids & {c.get("id") for c in candidate.cells} else None


def answered_cells(nb: nbformat.NotebookNode, released: nbformat.NotebookNode) -> int:
    """How many of the released notebook's answer cells hold something else than their stub
    in ``nb`` (0: a blank submission), matched by grade id, else by cell id."""
    stubs = {
        key: c.source.strip()
        for c in released.cells
        if course.is_answer(c)
        for key in (c.metadata["nbgrader"]["grade_id"], c.get("id"))
    }
    answered = set()
    for cell in nb.cells:
        key = cell.metadata.get("nbgrader", {}).get("grade_id") or cell.get("id")
        if key in stubs and cell.source.strip() != stubs[key]:
            answered.add(key)
    return len(answered)


def answered_copy(folder: Path, notebook: str, released: nbformat.NotebookNode) -> Path | None:
    """When ``<notebook>.ipynb`` in ``folder`` is the blank released notebook, the one other
    notebook there that holds answers to it (the student worked in a copy), if exactly one
    does."""
    named = folder / f"{notebook}.ipynb"
    try:
        if answered_cells(nbformat.read(named, as_version=4), released):
            return None
    except Exception:
        return None
    answered = []
    for other in sorted(folder.glob("*.ipynb")):
        if other == named:
            continue
        try:
            if answered_cells(nbformat.read(other, as_version=4), released):
                answered.append(other)
        except Exception:
            continue
    return answered[0] if len(answered) == 1 else None


def repair(nb: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[str]:
    """Fix the nbgrader metadata of a submitted notebook in place; return what was done."""
    notes = []
    by_id = {
        c.get("id"): c.metadata["nbgrader"] for c in released.cells if c.metadata.get("nbgrader")
    }
    known = set(grade_ids(released))
    restored = 0
    for cell in nb.cells:
        if not cell.metadata.get("nbgrader") and cell.get("id") in by_id:
            cell.metadata["nbgrader"] = dict(by_id[cell.get("id")])
            restored += 1
    if restored:
        notes.append(f"restored the nbgrader metadata of {restored} cells")
    seen: set[str] = set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta:
            continue
        grade_id = meta.get("grade_id")
        if grade_id not in known:
            notes.append(f"cell {grade_id!r} is not part of this notebook: graded as ordinary code")
            del cell.metadata["nbgrader"]
        elif grade_id in seen:
            notes.append(f"cell {grade_id!r} appears twice: the first one is graded")
            del cell.metadata["nbgrader"]
        else:
            seen.add(grade_id)
    added = _add_missing(nb, released)
    if added:
        notes.append(f"deleted graded cells put back: {', '.join(added)}")
    return notes


def _add_missing(nb: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[str]:
    """Insert the released copy of each graded cell the submission lacks, right after the
    nearest cell before it in the released notebook that the submission still has (any
    cell, matched by id: the demo cells that define what a test uses come before it). With
    no such cell, before the nearest one after it; with none at all, at the end. nbgrader
    restores the test code. Returns, per restored cell, where it was put."""
    released_ids = [c.get("id") for c in released.cells]
    added = []
    for index, cell in enumerate(released.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is None or grade_id in _ids_by_cell(nb):
            continue
        present = {c.get("id"): k for k, c in enumerate(nb.cells)}
        before = [present[i] for i in released_ids[:index] if i in present]  # released order
        after = [present[i] for i in released_ids[index + 1 :] if i in present]
        restored = nbformat.from_dict(dict(cell))
        restored["id"] = cell.get("id") if cell.get("id") not in present else f"restored-{grade_id}"
        if before:  # after the nearest earlier one, wherever the student moved it
            at = before[-1] + 1
            where = f"after cell {at}"
        elif after:
            at = after[0]
            where = f"before cell {at + 1}"
        else:
            at = len(nb.cells)
            where = "at the end"
        nb.cells.insert(at, restored)
        added.append(f"{grade_id} ({where})")
    return added


def _ids_by_cell(nb: nbformat.NotebookNode) -> list[str | None]:
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def student_written(nb: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[str]:
    """Sources of the code cells the student wrote or changed (not the released ones)."""
    original = {c.get("id"): c.source for c in released.cells}
    return [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and original.get(c.get("id")) != c.source
    ]


def digest(folder: Path) -> str:
    """A hash of every file in a student's section folder (names and contents)."""
    h = hashlib.sha256()
    if folder.is_dir():
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            h.update(path.relative_to(folder).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# What nbgrader's exchange writes beside a submission (coursehub/): not the student's files.
EXCHANGE_FILES = frozenset({"timestamp.txt", "submission_secret.txt"})


def stage(submitted: Path, staged: Path, notebooks: dict[str, Path], released_dir: Path) -> Staged:
    """Copy and repair ``notebooks`` (name -> submitted file) into ``staged``."""
    result = Staged()
    staged.mkdir(parents=True, exist_ok=True)
    for name, source in notebooks.items():
        released = nbformat.read(released_dir / f"{name}.ipynb", as_version=4)
        nb = nbformat.read(source, as_version=4)
        result.notes += repair(nb, released)
        written = student_written(nb, released)
        lines = integrity.suspicious_lines(written)
        if lines:
            result.notes.append("for review: " + " | ".join(lines))
        nbformat.write(nb, staged / f"{name}.ipynb")
        result.graded.append(name)
    used = {p.name for p in notebooks.values()}
    extra = sorted(
        p.relative_to(submitted).as_posix()
        for p in submitted.rglob("*")
        if p.is_file()
        and p.name not in used
        and p.name not in EXCHANGE_FILES
        and ".ipynb_checkpoints" not in p.parts
    )
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        result.notes.append(f"ignored extra files: {shown}")
    return result
