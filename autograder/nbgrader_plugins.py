"""nbgrader extensions used by the course's autograder (see nbgrader_config.py).

nbgrader 0.9.6 stops executing a notebook when its kernel dies and then records no grades at
all, so one ``os._exit()`` or out-of-memory kill leaves a student's whole row blank.
:class:`ExecuteUntilKernelDeath` keeps the cells run before the death, and marks the cell that
killed the kernel and every later code cell with an error output. nbgrader's own grading then
gives the tests that passed before the death their points and every later test zero.
"""

from __future__ import annotations

from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute

# The error name the autograder's driver looks for to report "error: kernel died".
KERNEL_DIED = "KernelDied"


def _error(evalue: str) -> NotebookNode:
    return NotebookNode(
        output_type="error",
        ename=KERNEL_DIED,
        evalue=evalue,
        traceback=[f"{KERNEL_DIED}: {evalue}"],
    )


class ExecuteUntilKernelDeath(Execute):
    """nbgrader's Execute, except that a dead kernel fails the remaining cells, not the run."""

    def preprocess(self, nb, resources=None, km=None):
        self._died_in_cell: int | None = None
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self._died_in_cell is not None:
            cell.outputs = [
                _error(f"not run: the kernel died in cell {self._died_in_cell + 1} before it")
            ]
            return cell, resources
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._died_in_cell = index
            self.log.warning("The kernel died in cell %d; later cells are marked as failed", index)
            cell.outputs = list(cell.get("outputs", [])) + [
                _error(
                    "the kernel died while running this cell (os._exit, a crash, or "
                    "running out of memory)"
                )
            ]
            return cell, resources
