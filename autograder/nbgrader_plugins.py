"""nbgrader extensions used by the course's autograder (see nbgrader_config.py).

:class:`ExecuteUntilKernelDeath` replaces nbgrader's Execute step:

* **a dead kernel keeps earlier points.** nbgrader 0.9.6 stops executing a notebook when its
  kernel dies and then records no grades at all, so one ``os._exit()`` or out-of-memory kill
  leaves a student's whole row blank. Here the cells run before the death keep their results,
  and the cell that killed the kernel and every later code cell get an error output; nbgrader's
  own grading then gives the tests that passed before the death their points, later ones zero.
* **tampering scores 0.** Before and after every graded test cell the kernel's fingerprint is
  compared with the one taken before the first cell (:mod:`autograder.integrity`); a test run
  in a kernel whose ``numpy``, ``math``, builtins, checking helpers or IPython machinery were
  patched gets an error output, so it scores 0 and the report says why.
* **a failed cell's processes end with it.** After a cell that raised or timed out, the
  processes it left running are ended (:mod:`autograder.strays`, in the kernel), so that a
  storm of them cannot starve the cells after it; the launcher's fork server stays.
* **output is capped.** A cell's printed output beyond ``max_output_bytes`` is dropped (one
  note says so), and so is everything past ``max_notebook_output_bytes`` in the whole
  notebook; error outputs are always kept, so flooding cannot hide a failed test, but each
  keeps only the head and tail of its message and traceback (``max_error_chars``): a graded
  notebook stays a few MB whatever the submission prints or raises.

Each of these is recorded as data in the cell's metadata (:mod:`autograder.outcomes`), which
the grader reads back; the error output is only there for nbgrader's scoring and the student.

:class:`NameLikelyBugs` names, beside a failed test, the catalogued mistake its error looks
like (:mod:`autograder.likely_bugs`), in words, before the message is hidden.

:class:`HideHiddenTests` runs before the feedback page is made: hidden test code is removed
from the test cells, and a failure inside a hidden test shows only "hidden test failed". And
the page is **sealed**: from the first cell that holds hidden tests on, the kernel has seen
them (IPython keeps each cell's source in ``In`` before running it, ``linecache`` and the
test's code objects keep it after), so nothing the student's code could have written from
then on reaches the page: a student cell's outputs are replaced by one note, and a test
cell shows only whether it passed and, for a failed visible check, its line of the released
test (the student runs the visible tests in their own notebook for the message). Masking
lines of hidden code cannot see an encoding, a compression or a shifted character; leaving
out every output the student's code controls can.
"""

from __future__ import annotations

import os
import queue
import re
import time
from pathlib import Path

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Float, Integer, Unicode

from autograder import course, integrity, outcomes, show_only, stopwatch


def _error(evalue: str, ename: str) -> NotebookNode:
    return NotebookNode(
        output_type="error",
        ename=ename,
        evalue=evalue,
        traceback=[f"{ename}: {evalue}"],
    )


def _place(cell: NotebookNode, index: int) -> dict:
    """Where a cell is, as the outcome records name it."""
    return {"cell": index + 1, "grade_id": cell.metadata.get("nbgrader", {}).get("grade_id")}


def _shortened(text: str, limit: int) -> str:
    """``text`` if it is at most ``limit`` characters, else its head and tail and the count cut."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    cut = len(text) - 2 * keep
    return f"{text[:keep]}\n[... the autograder cut {cut:,} characters here ...]\n{text[-keep:]}"


def _bounded_error(content: dict, limit: int) -> None:
    """An error message's name, value and traceback cut to about ``limit`` characters each."""
    content["ename"] = _shortened(str(content.get("ename", "")), 200)
    content["evalue"] = _shortened(str(content.get("evalue", "")), limit)
    frames = [_shortened(str(f), limit) for f in content.get("traceback", [])]
    if sum(map(len, frames)) > 2 * limit:  # a deep recursion: its first and last frames
        frames = (
            frames[:2]
            + [f"[... the autograder cut {len(frames) - 4} frames here ...]"]
            + frames[-2:]
        )
    content["traceback"] = frames


def _output_bytes(msg: dict) -> int:
    content = msg.get("content", {})
    if msg.get("msg_type") == "stream":
        return len(content.get("text", ""))
    return sum(len(str(v)) for v in content.get("data", {}).values())


def _log_messages_beside(resources: dict | None) -> Path | None:
    """The kernel about to start, and its ranks, log their communication (``distopt``'s
    recorder: :data:`distopt.engine.record.LOG_ENV`) to a file beside the graded notebook,
    for the similarity report (:mod:`autograder.similarity`); the grader writes each test
    cell's times to another (returned; None where the notebook's folder is not known). Both
    start afresh."""
    from autograder.similarity import message_log_name, test_times_name

    metadata = (resources or {}).get("metadata", {})
    notebook = metadata.get("name") or (resources or {}).get("unique_key", "notebook")
    if not metadata.get("path"):
        os.environ.pop("DISTOPT_MESSAGE_LOG", None)
        return None
    folder = Path(metadata["path"]).resolve()  # absolute: ranks need not start in it
    for name in (message_log_name(notebook), test_times_name(notebook)):
        (folder / name).unlink(missing_ok=True)
    # the kernel, under a uid of its own, creates the first; the second stays the grader's
    os.environ["DISTOPT_MESSAGE_LOG"] = str(folder / message_log_name(notebook))
    return folder / test_times_name(notebook)


class ExecuteUntilKernelDeath(Execute):
    """nbgrader's Execute, plus: kernel death fails the remaining cells, not the run; tests
    in a tampered kernel score 0; a cell's output is capped. What happened is recorded in
    each cell's metadata as :mod:`autograder.outcomes` records."""

    max_output_bytes = Integer(
        1_000_000, help="printed output kept per cell, in bytes (errors are always kept)"
    ).tag(config=True)
    max_notebook_output_bytes = Integer(
        3_000_000, help="printed output kept in the whole notebook, in bytes"
    ).tag(config=True)
    max_error_chars = Integer(
        4_000, help="characters kept of an error's message and of each traceback frame"
    ).tag(config=True)
    integrity_timeout = Float(30.0, help="seconds the kernel has to answer an integrity check").tag(
        config=True
    )
    check_integrity = Integer(1, help="1: fingerprint the kernel around test cells").tag(
        config=True
    )
    show_only_from = Unicode(
        "",
        help="the released section's folder: its cells tagged show-only are not run when "
        "unchanged and not needed (autograder.show_only); empty: every cell runs",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        from autograder.kernels import SandboxedKernelManager  # plain kernels unless sandboxed

        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        self.start_notebook(nb)
        self._test_times = _log_messages_beside(resources)
        with stopwatch.step("plan"):
            self._skipped = self._show_only_plan(nb, resources)
        with stopwatch.step("kernel"):  # less the cells' own steps, counted inside
            return super().preprocess(nb, resources, km)

    def start_notebook(self, nb) -> None:
        """Forget the last notebook; only this step writes records (a submission's are forged)."""
        outcomes.clear(nb)
        self._lost_in: int | None = None  # the cell (1-based) in which the kernel was lost
        self._place: dict = {}
        self._baseline: dict | None = None
        self._seen_modules: dict[str, str] = {}
        self._cell_bytes: dict[int, int] = {}
        self._notebook_bytes = 0
        self._unresponsive = False
        tests = [c.source for c in nb.cells if course.is_test(c)]
        self._test_names = integrity.names_used(tests)
        self._shown_names = integrity.visible_names(tests)  # what reports may quote

    def _show_only_plan(self, nb, resources) -> frozenset[int]:
        """The cells not run (:mod:`autograder.show_only`), by the released notebook's tags."""
        notebook = ((resources or {}).get("nbgrader") or {}).get("notebook")
        if not self.show_only_from or not notebook:
            return frozenset()
        released = Path(self.show_only_from) / f"{notebook}.ipynb"
        skipped = frozenset(show_only.plan_notebook(nb, show_only.marked(released)))
        if skipped:
            self.log.info("Not running %d show-only cells", len(skipped))
        return skipped

    # --- the kernel's start and stop, timed (autograder.stopwatch) ------------------------

    async def async_start_new_kernel(self, **kwargs):
        with stopwatch.step("kernel start"):
            return await super().async_start_new_kernel(**kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)  # nbconvert's sync path calls these

    async def async_start_new_kernel_client(self):
        with stopwatch.step("kernel ready"):
            return await super().async_start_new_kernel_client()

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    async def _async_cleanup_kernel(self) -> None:
        with stopwatch.step("kernel stop"):
            await super()._async_cleanup_kernel()

    _cleanup_kernel = run_sync(_async_cleanup_kernel)

    # --- integrity ---------------------------------------------------------------------

    async def _async_silent(self, code: str, expressions: dict[str, str]) -> dict | None:
        """Run ``code`` and evaluate ``expressions`` in the kernel without a trace in its
        history or outputs; the execute_reply's content, or None without an answer in time."""
        msg_id = self.kc.execute(
            code, silent=True, store_history=False, user_expressions=expressions
        )
        start = time.monotonic()
        deadline, patient = start + self.integrity_timeout, False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # A kernel that has just been interrupted (a timeout, a fork bomb's children
                # ended) on a busy machine (more runnable processes than cores: a course
                # server) may need longer than an idle one: wait BUSY_PATIENCE times as long
                # before the next test is marked not run (issue 59).
                if patient or not _busy():
                    return None
                patient, deadline = True, start + BUSY_PATIENCE * self.integrity_timeout
                self.log.warning("The kernel is slow to answer on a busy machine: waiting longer")
                continue
            try:
                msg = await self.kc.shell_channel.get_msg(timeout=remaining)
            except queue.Empty:  # no answer yet: the deadline decides
                continue
            except Exception:  # a dead channel: no answer
                return None
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    async def _async_fingerprint(self, light: bool = False) -> dict | None:
        code, whole = integrity.fingerprint_request()
        expression = integrity.names_request() if light else whole
        content = await self._async_silent(code, {"fp": expression})
        return None if content is None else integrity.parse_reply(content)

    def _note_modules(self) -> None:
        """After a cell that is not a test: which names hold modules by now (the light
        request; a missing answer makes the next checks say so, as a whole one would)."""
        if self._unresponsive:
            return
        with stopwatch.step("fingerprints"):
            try:
                now = run_sync(self._async_fingerprint)(light=True)
            except Exception as exc:  # a closed channel, a dying kernel: no answer
                self.log.warning("Integrity check failed: %s", exc)
                now = None
        self._unresponsive = not integrity.note_modules(now, self._seen_modules)

    def _tampering(self) -> list[str]:
        with stopwatch.step("fingerprints"):
            return self._tampering_now()

    def _tampering_now(self) -> list[str]:
        if self._unresponsive:  # asking again would only wait again
            return ["the integrity check got no answer from the kernel"]
        try:
            now = run_sync(self._async_fingerprint)()
        except Exception as exc:  # a closed channel, a dying kernel: no answer
            self.log.warning("Integrity check failed: %s", exc)
            now = None
        self._unresponsive = now is None
        if self._baseline is None:
            self._baseline = now
            return [] if now else ["the integrity check got no answer from the kernel"]
        return integrity.differences(
            self._baseline, now, self._seen_modules, self._test_names, self._shown_names
        )

    async def _async_end_strays(self) -> int | None:
        """Have the kernel end what the last cell left running; how many, or None."""
        whole_uid = bool(getattr(self.km, "sandboxed", False))
        content = await self._async_silent("", {"n": integrity.strays_request(whole_uid)})
        result = (content or {}).get("user_expressions", {}).get("n", {})
        text = result.get("data", {}).get("text/plain", "")
        # the kernel answers: a count of at most 6 digits (a longer one would carry its text)
        ok = result.get("status") == "ok" and text.isdigit() and len(text) <= 6
        return int(text) if ok else None

    def _end_strays(self, cell: NotebookNode) -> None:
        """After a cell that raised or timed out: end the processes it left running."""
        with stopwatch.step("strays"):
            self._end_strays_now(cell)

    def _end_strays_now(self, cell: NotebookNode) -> None:
        try:
            ended = run_sync(self._async_end_strays)()
        except Exception as exc:  # a closed channel, a dying kernel: nothing to end
            self.log.warning("Ending the processes cell %s left failed: %s", self._place, exc)
            return
        if ended:
            outcomes.record(cell, outcomes.StraysEnded(**self._place, count=ended))

    def _mark_tampered(self, cell: NotebookNode, when: str, found: list[str]) -> None:
        tampered = outcomes.Tampered(**self._place, when=when, changes=tuple(found))
        self.log.warning("Tampering %s a test cell: %s", when, tampered.phrase())
        outcomes.record(cell, tampered)

    # --- execution ----------------------------------------------------------------------

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        self._place = _place(cell, index)
        if self._lost_in is not None:
            cell.outputs = []
            outcomes.record(cell, outcomes.NotRun(**self._place, after=self._lost_in))
            return cell, resources
        if index in getattr(self, "_skipped", ()):
            cell.outputs, cell.execution_count = [], None
            outcomes.record(cell, outcomes.ShowOnly(**self._place))
            return cell, resources
        check = bool(self.check_integrity)
        if check and self._baseline is None:
            self._tampering()  # the baseline, before any of the student's code runs
        before = self._tampering() if check and course.is_test(cell) else []
        began = time.time()
        try:
            with stopwatch.step("cells"):
                cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            died = outcomes.KernelDied(
                **self._place, cause="os._exit, a crash, or running out of memory"
            )
            return self._lost(cell, resources, died)
        except CellTimeoutError:
            # nbclient interrupted the cell but got no reply in time (a kernel swamped by its
            # own child processes, say). The cell timed out; later cells run if the kernel
            # still answers, and are marked as not run if it does not.
            # (not the error's message: nbclient's quotes the cell, hidden tests included,
            # and nbgrader's log may end up in the report: NbgraderFailed)
            self.log.warning("Cell %d timed out and its kernel did not answer", index)
            outcomes.record(cell, outcomes.CellTimeout(**self._place, limit_s=self.timeout))
            with stopwatch.step("fingerprints"):
                answered = run_sync(self._async_fingerprint)() is not None
            if not answered:
                self._lost_in = index + 1
            else:
                self._end_strays(cell)
            return cell, resources
        except Exception as exc:  # an unreadable message, a broken channel: as if it died
            # Its message may quote what the kernel sent (and nbgrader's log may reach the
            # report): the record and the log keep only the grader's own error class.
            self.log.warning("Cell %d: the kernel was lost (%s)", index, type(exc).__name__)
            cause = type(exc).__name__[:60]
            return self._lost(cell, resources, outcomes.KernelLost(**self._place, cause=cause))
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            self._end_strays(cell)
        if course.is_test(cell) and getattr(self, "_test_times", None):
            from autograder.similarity import note_test_cell

            note_test_cell(self._test_times, cell, began, time.time())
        if before:
            self._mark_tampered(cell, "before", before)
        elif check and course.is_test(cell):
            after = self._tampering()
            if after:
                self._mark_tampered(cell, "while running", after)
        elif check:
            self._note_modules()  # which names hold modules (``np``, ``math``) by now
        return cell, resources

    def _lost(self, cell, resources, lost: outcomes.KernelDied | outcomes.KernelLost):
        """The kernel is gone (or unreachable) in this cell: later cells are not run."""
        self._lost_in = lost.cell
        self.log.warning("%s; later cells fail", lost.phrase())
        outcomes.record(cell, lost)
        return cell, resources

    async def _async_handle_timeout(self, timeout: int, cell: NotebookNode | None = None):
        # nbclient writes the error output of a timeout (from error_on_timeout): the record's.
        if cell is not None:
            timed_out = outcomes.CellTimeout(**self._place, limit_s=timeout)
            outcomes.record(cell, timed_out, output=False)
            error = timed_out.output()
            self.error_on_timeout = {k: error[k] for k in ("ename", "evalue", "traceback")}
        return await super()._async_handle_timeout(timeout, cell)

    def output(self, outs, msg, display_id, cell_index):
        if msg.get("msg_type") == "error":
            _bounded_error(msg.setdefault("content", {}), self.max_error_chars)
            return super().output(outs, msg, display_id, cell_index)
        size = _output_bytes(msg)
        before = self._cell_bytes.get(cell_index, 0)
        # This cell's share: the per-cell cap, or what the notebook's budget has left.
        limit = min(
            self.max_output_bytes, before + self.max_notebook_output_bytes - self._notebook_bytes
        )
        self._cell_bytes[cell_index] = before + size
        if before + size > limit:
            if before <= limit and not any(
                isinstance(o, outcomes.OutputCut)
                for o in outcomes.recorded(self.nb.cells[cell_index])
            ):
                cut = outcomes.OutputCut(**self._place, limit_bytes=max(0, limit))
                outcomes.record(self.nb.cells[cell_index], cut, output=False)
                outs.append(cut.output())
            return None
        self._notebook_bytes += size
        return super().output(outs, msg, display_id, cell_index)


_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?(^[ \t]*### END HIDDEN TESTS[^\n]*\n?|\Z)",
                     re.MULTILINE | re.DOTALL)  # fmt: skip
_CELL_LINE = re.compile(r"(?:Cell In\s*\[\d*\]|<ipython-input-\d+-\w+>),\s*line (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _hidden_from_line(source: str) -> int | None:
    """1-based first line of the hidden region of a test cell, or None if it has none."""
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip().startswith("### BEGIN HIDDEN TESTS"):
            return number
    return None


def _failed_in_hidden(output: NotebookNode, hidden_from: int) -> bool:
    """Whether an error output's innermost line in the test cell lies in the hidden region."""
    text = _ANSI.sub("", "\n".join(output.get("traceback", [])))
    lines = [int(n) for n in _CELL_LINE.findall(text)]
    # No line number at all (e.g. a timeout): say nothing about the hidden code either.
    return not lines or lines[0] >= hidden_from


def _failing_line(output: NotebookNode) -> int | None:
    lines = _CELL_LINE.findall(_ANSI.sub("", "\n".join(output.get("traceback", []))))
    return int(lines[0]) if lines else None


SEALED_NOTE = (
    "[output not shown in the feedback: this cell ran after hidden tests were in the "
    "kernel; run your notebook to see it]"
)


def _note(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text + "\n")


BUSY_PATIENCE = 4  # times the integrity timeout a kernel gets on a busy machine


def _busy() -> bool:
    """More runnable processes than cores, on average over the last minute."""
    try:
        return os.getloadavg()[0] > len(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return False


class NameLikelyBugs(NbGraderPreprocessor):
    """For feedback pages, before :class:`HideHiddenTests`: a failed test whose error looks
    like a catalogued mistake (:mod:`autograder.likely_bugs`) gets the sentence that names it
    in ``cell.metadata["likely_bug"]``, which the page shows beside the test. The sentence is
    the mistake's name in words for the student, never the test's message or values; what a
    submission wrote into that key itself is dropped."""

    def preprocess(self, nb, resources):
        from autograder import evidence, likely_bugs

        section = (resources or {}).get("nbgrader", {}).get("assignment")
        tests = [c for c in nb.cells if course.is_test(c)]
        failed = {
            c.metadata.get("nbgrader", {}).get("grade_id")
            for c in tests
            if float(c.metadata.get("nbgrader", {}).get("score", 0) or 0)
            < float(c.metadata.get("nbgrader", {}).get("points", 0) or 0)
        }
        for cell in nb.cells:
            cell.metadata.pop("likely_bug", None)
        for cell in tests:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            errors = [
                o
                for o in cell.get("outputs", [])
                if o.get("output_type") == "error" and not outcomes.wrote(cell, o)
            ]
            if grade_id not in failed or not errors or outcomes.recorded(cell):
                continue
            found = likely_bugs.lookup(
                grade_id,
                str(errors[0].get("ename", "")),
                str(errors[0].get("evalue", "")),
                failed=failed,
                section=section,
                evidence=evidence.in_submission(nb, section, grade_id),
            )
            if found is not None:
                cell.metadata["likely_bug"] = likely_bugs.sentence(found)
        return nb, resources


class HideHiddenTests(NbGraderPreprocessor):
    """For feedback pages: hidden tests leave no code, and their failures no detail.

    From the first cell holding hidden tests on, the page is sealed (see the module doc):
    only the autograder's own messages, a note for each student cell that had output, and
    for each test whether it passed. Before that cell no hidden code was in the kernel, and
    the outputs are shown as they are; any line of hidden test code that shows up verbatim
    in any output is replaced by ``[hidden]`` all the same.
    """

    def preprocess(self, nb, resources):
        self._hidden_lines = sorted(
            {
                line.strip()
                for cell in nb.cells
                if course.is_test(cell)
                for match in _HIDDEN.finditer(cell.source)
                for line in match.group(0).splitlines()[1:]
                if len(line.strip()) >= 8 and not line.strip().startswith("### END")
            },
            key=len,
            reverse=True,
        )
        self._sealed = False
        with stopwatch.step("seal"):
            nb, resources = super().preprocess(nb, resources)
            for cell in nb.cells:
                for output in cell.get("outputs", []):
                    self._scrub(output)
        return nb, resources

    def _seal(self, cell: NotebookNode) -> None:
        """A student cell run after hidden tests: the autograder's messages and one note."""
        own = [o for o in cell.get("outputs", []) if not outcomes.wrote(cell, o)]
        kept = [o for o in cell.get("outputs", []) if outcomes.wrote(cell, o)]
        cell.outputs = ([_note(SEALED_NOTE)] if own else []) + kept

    def _scrub(self, output: NotebookNode) -> None:
        def clean(text: str) -> str:
            for line in self._hidden_lines:
                text = text.replace(line, "[hidden]")
            return text

        if "text" in output:
            output["text"] = clean(output["text"])
        if "traceback" in output:
            output["traceback"] = [clean(t) for t in output["traceback"]]
        for mime, value in output.get("data", {}).items():
            if isinstance(value, str):
                output["data"][mime] = clean(value)

    def preprocess_cell(self, cell, resources, index):
        is_test = course.is_test(cell)
        hidden_from = _hidden_from_line(cell.source) if is_test else None
        self._sealed = self._sealed or hidden_from is not None  # from this cell on
        if cell.cell_type != "code" or (not is_test and not self._sealed):
            return cell, resources
        if not is_test:
            self._seal(cell)
            return cell, resources
        if hidden_from is None and not self._sealed:
            return cell, resources
        outputs = []
        for output in cell.get("outputs", []):
            if outcomes.wrote(cell, output):
                outputs.append(output)  # the autograder's own messages show no test code
            elif output.get("output_type") != "error":
                if not self._sealed:
                    outputs.append(output)
            elif hidden_from is not None and _failed_in_hidden(output, hidden_from):
                outputs.append(_error("hidden test failed", "HiddenTestFailed"))
            elif self._sealed:
                # The message may quote what the student's code returned: only the line, and
                # the error's name where it is one of the known vocabulary (a class the
                # notebook made may be named with any text, e.g. hidden lines in base64).
                ename = outcomes.error_name(output.get("ename", ""))
                outputs.append(_error(self._visible_line(cell, output), ename))
            else:
                # A visible line failed; IPython's traceback would also show the lines
                # around it, hidden ones included: keep only the error itself.
                where = f"(line {_failing_line(output)} of the test)"
                evalue = " ".join(filter(None, [output.get("evalue", ""), where]))
                outputs.append(_error(evalue, output.ename))
        cell.outputs = outputs
        cell.source = _HIDDEN.sub("# (hidden tests)\n", cell.source).rstrip() + "\n"
        return cell, resources

    @staticmethod
    def _visible_line(cell: NotebookNode, output: NotebookNode) -> str:
        """A failed visible check, named by its line of the released test cell."""
        number = _failing_line(output)
        lines = cell.source.splitlines()
        if number is None or not 1 <= number <= len(lines):
            return "a visible check of this test failed; run the test in your notebook to see why"
        return (
            f"line {number} of the test failed: {lines[number - 1].strip()[:200]} "
            "(run the test in your notebook to see the message)"
        )


_MATH = re.compile(r"(?<![\\$])(\$\$(.+?)\$\$|\$(?!\s)([^$\n]+?)(?<!\s)\$)", re.DOTALL)
_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)


def math_to_mathml(markdown: str) -> str:
    """``$...$`` and ``$$...$$`` of a markdown text as MathML, which browsers draw without
    MathJax or a network (latex2mathml); code spans and blocks are left alone, and a formula
    it cannot convert stays as TeX in a code span."""
    from latex2mathml.converter import convert

    def formula(match: re.Match) -> str:
        display = match.group(2) is not None
        tex = match.group(2) if display else match.group(3)
        try:
            return convert(tex.strip(), display="block" if display else "inline")
        except Exception:
            return f"`{tex}`"

    parts = _CODE.split(markdown)
    return "".join(part if part.startswith("`") else _MATH.sub(formula, part) for part in parts)


class LabelForPage(NbGraderPreprocessor):
    """For feedback pages: each cell learns the heading it is under (the exercise a test
    belongs to, as the student sees it in JupyterLab), and markdown math becomes MathML."""

    def preprocess(self, nb, resources):
        heading = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found = [
                    line.lstrip("#").strip()
                    for line in cell.source.splitlines()
                    if line.startswith("#")
                ]
                heading = found[-1] if found else heading
                cell.source = math_to_mathml(cell.source)
            cell.metadata["course_heading"] = heading
        from pygments.formatters import HtmlFormatter

        resources["course_css"] = HtmlFormatter().get_style_defs(".highlight")
        return nb, resources


class _CompiledTemplates:
    """Jinja's compiled templates, kept for the worker's life: each feedback page makes a new
    exporter, which would otherwise compile the same templates again (a tenth of a second per
    page). A template is known by its name and a checksum of its text (jinja's bucket key and
    checksum), so an edited template is compiled anew."""

    def __init__(self) -> None:
        from jinja2 import BytecodeCache

        class _Memory(BytecodeCache):
            def __init__(self) -> None:
                self.compiled: dict[str, bytes] = {}

            def load_bytecode(self, bucket) -> None:
                code = self.compiled.get(bucket.key)
                if code is not None:
                    bucket.bytecode_from_string(code)

            def dump_bytecode(self, bucket) -> None:
                self.compiled[bucket.key] = bucket.bytecode_to_string()

        self.cache = _Memory()


_TEMPLATES: _CompiledTemplates | None = None
_IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\salt=)")


def feedback_exporter():
    """:class:`FeedbackPageExporter`, made on first use (nbconvert is loaded by then)."""
    from nbconvert.exporters import HTMLExporter, TemplateExporter

    class FeedbackPageExporter(HTMLExporter):
        """nbconvert's HTML exporter without its last pass, and with compiled templates kept.

        HTMLExporter parses every page it made with BeautifulSoup, to give images without a
        description one and to make JupyterLab's cells focusable, and writes it out again:
        half of a feedback page's cost (0.7 of 1.5 s for section 01). The course's page
        template (autograder/templates/feedback) has no JupyterLab cells; images get their
        description here by a pattern instead.
        """

        def _create_environment(self):
            global _TEMPLATES
            environment = super()._create_environment()
            _TEMPLATES = _TEMPLATES or _CompiledTemplates()
            environment.bytecode_cache = _TEMPLATES.cache
            return environment

        def from_notebook_node(self, nb, resources=None, **kw):
            language = nb.metadata.get("language_info", {})
            lexer = language.get("pygments_lexer", language.get("name"))
            resources = self._init_resources(resources)
            # the two filters HTMLExporter registers before rendering
            from nbconvert.filters.highlight import Highlight2HTML
            from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

            highlight = Highlight2HTML(pygments_lexer=lexer, parent=self)
            self.register_filter("highlight_code", self.filters.get("highlight_code", highlight))
            self.register_filter(
                "filter_data_type",
                WidgetsDataTypeFilter(
                    notebook_metadata=self._nb_metadata, parent=self, resources=resources
                ),
            )
            page, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
            page = _IMG_WITHOUT_ALT.sub('<img alt="a figure the notebook drew"', page)
            return page, resources

    return FeedbackPageExporter
