"""How far do the reference notebooks' printed numbers move with the CPU's kernels?

    python -m autograder.spread [SECTION ...]        (make spread [SECTION=...])

Float sums round differently when torch, oneDNN, MKL or OpenBLAS pick other kernels, and
they pick by CPU family: a student's laptop is not the machine the outputs were stored on.
This tool runs every reference notebook of the given sections (all by default) once per
kernel selection in ``SELECTIONS``, compares each code cell's text output with the stored
one, and prints every line that differs in any run, with its value in each run. Course
authors use it before choosing how many digits a number gets or what band an assertion
allows (docs/authors.md, "Numbers that hold on every CPU"); the closing note of a change quotes it.

Cells marked NBVAL_IGNORE_OUTPUT are reported too (their bands need the spread as well),
tagged "ignored"; any other differing cell is tagged "CHECKED": nbval would fail it under
that selection. The executed copies stay in the folder printed at the end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder import course

# Each selection is what a CPU of another family would pick, forced on this one. An x86 CPU
# has at least SSE4.2, so the lowest settings differ from the native kernels everywhere.
SELECTIONS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-sse41+mkl-sse42": {"DNNL_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "openblas-prescott": {"OPENBLAS_CORETYPE": "Prescott"},
}
IGNORE_MARKER = "# NBVAL_IGNORE_OUTPUT"


def nbval_kernels(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The kernels nbval runs the reference notebooks under in make test: other ones than this
    machine's own, in every library at once.

    ATen always runs its portable ("default") kernels. On x86, oneDNN and MKL run one level
    below what the CPU has: AVX2 on an AVX-512 CPU, else SSE4.1/4.2; OpenBLAS its Prescott
    kernels. Each differs from the native selection of every x86 CPU of the last decade, so
    the stored outputs, recorded on some machine's native kernels, are always checked against
    others; AVX2 rather than SSE on an AVX-512 CPU keeps the matrix products fast (measured: the
    training project's nbval run took 1.6x its native time with AVX2, about 4x with SSE).
    Elsewhere (ARM) only ATen's setting applies. (``make spread`` measures each library's
    lowest selection.)
    """
    env = dict(SELECTIONS["aten-default"])
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return env
    env |= SELECTIONS["onednn-sse41+mkl-sse42"] | SELECTIONS["openblas-prescott"]
    try:
        avx512 = re.search(r"^flags\s*:.*\bavx512f\b", cpuinfo.read_text(), re.MULTILINE)
    except OSError:  # not Linux: the lowest settings, which differ from any native ones too
        avx512 = None
    if avx512:
        env |= {"DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    return env


ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def cell_text(cell) -> str:
    """The text a code cell showed: streams and plain-text results, addresses masked."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.get("data", {}).get("text/plain", "") + "\n")
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}\n")
    return ADDRESS.sub("0xADDRESS", "".join(parts))


def run_notebook(path: Path, env_update: dict[str, str], out: Path) -> tuple[float, str]:
    """Execute path in a fresh kernel whose environment has env_update; write it to out."""
    env = course.tool_env() | env_update
    # autograder.runner in a process of its own: the kernel inherits its environment
    command = [sys.executable, "-m", "autograder.runner", str(path), str(out)]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "--cwd", str(path.parent), "--timeout", "600", "--allow-errors"],
        cwd=course.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start, done.stderr[-2000:] if done.returncode else ""


def differing_lines(texts: dict[str, str]) -> list[tuple[int, dict[str, str]]]:
    """Line numbers whose text is not the same in every run, with each run's line."""
    split = {name: text.splitlines() for name, text in texts.items()}
    longest = max(len(lines) for lines in split.values())
    rows = []
    for k in range(longest):
        seen = {name: lines[k] if k < len(lines) else "<missing>" for name, lines in split.items()}
        if len(set(seen.values())) > 1:
            rows.append((k, seen))
    return rows


def report(path: Path, runs: dict[str, Path]) -> int:
    """Print the cells of one notebook whose output differs; returns how many nbval checks."""
    stored = nbformat.read(path, as_version=4)
    executed = {name: nbformat.read(p, as_version=4) for name, p in runs.items()}
    by_id = {name: {c.get("id"): c for c in nb.cells} for name, nb in executed.items()}
    checked_failures = 0
    code_index = -1
    for position, cell in enumerate(stored.cells):
        if cell.cell_type != "code":
            continue
        code_index += 1
        texts = {"stored": cell_text(cell)}
        for name in runs:
            texts[name] = cell_text(by_id[name].get(cell.get("id"), {}))
        rows = differing_lines(texts)
        if not rows:
            continue
        ignored = any(line.strip() == IGNORE_MARKER for line in cell.source.splitlines())
        checked = not ignored and cell.get("execution_count") is not None
        checked_failures += checked
        tag = "CHECKED" if checked else "ignored"
        print(f"\n  cell {position} (nbval Cell {code_index}) [{tag}]")
        for k, seen in rows[:12]:
            print(f"    line {k + 1}:")
            for name, line in seen.items():
                print(f"      {name:>24s} | {line[:150]}")
        if len(rows) > 12:
            print(f"    ... {len(rows) - 12} more differing lines")
    return checked_failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", help="section ids (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks run at once")
    args = parser.parse_args(argv)
    sections = args.sections or course.sections()
    notebooks = [p for s in sections for p in sorted((course.SOLUTIONS / s).glob("*.ipynb"))]
    if not notebooks:
        print(f"no reference notebooks in sections {sections}; known: {course.sections()}")
        return 2
    out_dir = Path(tempfile.mkdtemp(prefix="kernel-spread-"))
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for path in notebooks:
            for name, env_update in SELECTIONS.items():
                out = out_dir / name / path.parent.name / path.name
                out.parent.mkdir(parents=True, exist_ok=True)
                jobs[(path, name)] = (out, pool.submit(run_notebook, path, env_update, out))
    print("Kernel selections:")
    for name, env_update in SELECTIONS.items():
        settings = " ".join(f"{k}={v}" for k, v in env_update.items()) or "(this CPU's own)"
        print(f"  {name:>24s}: {settings}")
    failures = 0
    for path in notebooks:
        runs = {}
        print(f"\n{path.relative_to(course.ROOT)}")
        for name in SELECTIONS:
            out, future = jobs[(path, name)]
            seconds, error = future.result()
            print(
                f"  {name:>24s}: ran in {seconds:5.1f} s" + (f"; FAILED: {error}" if error else "")
            )
            if not error:
                runs[name] = out
        if runs:
            failures += report(path, runs)
    print(f"\n{failures} nbval-checked cell(s) differ under some selection; copies in {out_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
