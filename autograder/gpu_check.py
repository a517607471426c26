"""The course on a GPU node: every rank exercise's reference answer and tests on NCCL, the
all-reduce's alpha and beta, and the training project's throughput and MFU.

    make gpu-check                                   (python -m autograder.gpu_check)
    python -m autograder.gpu_check --sections 01_data_parallel --skip-train
    python -m autograder.gpu_check --rehearse-on-cpu (every step on gloo: try the script here)

On a machine without CUDA it says so and exits 0 without running anything. With CUDA:

1. **The machine**: GPU model and count, torch, CUDA and NCCL versions, the GPU's nominal dense
   bfloat16 peak (:data:`PEAK_BF16_TFLOPS`, or ``--peak-tflops``).
2. **All-reduce**: ``all_reduce`` of float32 buffers from 8 KiB to 128 MiB on one rank per GPU,
   each size timed over several calls (the slowest rank's median), then, as nccl-tests report
   it, the *algorithm bandwidth* S/t and the *bus bandwidth* S/t x 2(N-1)/N (what every link
   carries in a ring), and the alpha-beta fit t = alpha + 2(N-1)/N x S / beta_bus (section 01's
   model) by least squares. Needs 2 GPUs; with one it says so.
3. **Rank exercises**: each section's reference notebook, reduced to its set-up, answers and
   test cells (as the mutant catalogue runs it), executed with ``DISTOPT_BACKEND=auto``: every
   launch with a GPU for each rank runs on NCCL, with rank r on cuda:r and the rank's default
   device set there; a launch with more ranks than GPUs runs on gloo (NCCL refuses two ranks on
   one GPU). Printed per section: the tests passed, the launches on NCCL and on gloo, and each
   failing test's error.
4. **Training project**: ``torchrun`` of :mod:`distopt.project.train` (DDP, then FSDP2) with one
   process per GPU on a GPT of 12 layers, width 768 and 1,024-token sequences, in bfloat16:
   tokens/s after two warm-up steps, and MFU = tokens/s x FLOPs/token / (GPUs x peak).

Everything goes to stdout as it is measured, ending with one line per part that
``--json FILE`` also writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder import course

# Nominal dense (not 2:4 sparse) bfloat16 tensor-core peaks, in TFLOP/s, from the vendors'
# data sheets; matched against torch.cuda.get_device_name() in order.
PEAK_BF16_TFLOPS = (
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
    ("A10", 125.0),
)
ALLREDUCE_SIZES = tuple(8 * 1024 * 4**k for k in range(8))  # 8 KiB .. 128 MiB
CPU_SIZES = (64 * 1024, 1024**2, 4 * 1024**2)  # the rehearsal on gloo: small and quick
TRAIN_ARGS = ("--d-model", "768", "--n-layer", "12", "--seq-len", "1024")
CPU_TRAIN_ARGS = ("--d-model", "64", "--n-layer", "2", "--seq-len", "32")


def peak_tflops(name: str) -> float | None:
    """The nominal dense bfloat16 peak of the GPU called ``name``, or None if not listed."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def machine() -> dict:
    """What runs here: torch, CUDA, NCCL, and the GPUs."""
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": 0}
    if torch.cuda.is_available():
        info["gpus"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 1024**3, 1)
        info["peak_bf16_tflops"] = peak_tflops(props.name)
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return info


# --- all-reduce ----------------------------------------------------------------------------


def allreduce_times(rank: int, world_size: int, sizes: tuple[int, ...], calls: int) -> list:
    """In each rank: the median seconds of ``calls`` all-reduces of each size (bytes of
    float32), after two warm-up calls; the slowest rank's median is what every rank returns."""
    import torch
    import torch.distributed as dist

    on_gpu = torch.cuda.is_available() and dist.get_backend() == "nccl"

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    medians = []
    for size in sizes:
        buffer = torch.ones(size // 4)  # on the rank's device (the launcher's default)
        for _ in range(2):
            dist.all_reduce(buffer)
        sync()
        times = []
        for _ in range(calls):
            dist.barrier()
            sync()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            sync()
            times.append(time.perf_counter() - start)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        medians.append(float(slowest.item()))
    return medians


def fit_alpha_beta(sizes: list[int], seconds: list[float], world_size: int) -> tuple[float, float]:
    """Least squares t = alpha + f S / beta with f = 2(N-1)/N (a ring all-reduce's bytes per
    link per byte of buffer): (alpha seconds, beta bytes/s of bus bandwidth)."""
    if world_size < 2 or len(sizes) < 2:
        raise ValueError("fit_alpha_beta needs 2 or more ranks and 2 or more sizes")
    factor = 2 * (world_size - 1) / world_size
    xs = [factor * s for s in sizes]
    mean_x, mean_t = statistics.fmean(xs), statistics.fmean(seconds)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, seconds, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    if slope <= 0:
        raise ValueError("all-reduce time does not grow with size: time larger buffers")
    return mean_t - slope * mean_x, 1 / slope


def allreduce_report(world_size: int, sizes: tuple[int, ...], calls: int, backend: str) -> dict:
    from distopt import launch

    medians = launch(allreduce_times, world_size, sizes, calls, backend=backend, timeout=600)[0]
    factor = 2 * (world_size - 1) / world_size
    print(f"\nall_reduce on {world_size} ranks ({backend}), float32, median of {calls} calls:")
    print(f"{'bytes':>12} {'time':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for size, t in zip(sizes, medians, strict=True):
        algbw = size / t / 1e9
        print(f"{size:>12,} {t * 1e6:>9.1f} us {algbw:>11.2f} {factor * algbw:>11.2f}")
    found = {"ranks": world_size, "backend": backend, "bytes": list(sizes), "seconds": medians}
    try:
        alpha, beta = fit_alpha_beta(list(sizes), medians, world_size)
    except ValueError as exc:
        print(f"alpha-beta fit: none ({exc})")
        return found
    print(f"alpha-beta fit: alpha {alpha * 1e6:.1f} us, beta (bus) {beta / 1e9:.2f} GB/s")
    return {**found, "alpha_us": alpha * 1e6, "beta_bus_gb_s": beta / 1e9}


# --- rank exercises ------------------------------------------------------------------------


def exercise_report(section: str, backend: str) -> dict:
    """The section's reference answers and tests (tests only), with launches on ``backend``."""
    from autograder.likely_bugs import test_errors
    from tests.grader import mutants

    notebook = course.section_notebooks(section)[0]
    tests = sorted({t for ts in mutants.tests_of_answers(section, notebook).values() for t in ts})
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "backends.txt"
        saved = {k: os.environ.get(k) for k in ("DISTOPT_BACKEND", "DISTOPT_BACKEND_LOG")}
        os.environ.update(DISTOPT_BACKEND=backend, DISTOPT_BACKEND_LOG=str(log))
        start = time.perf_counter()
        try:
            failed = test_errors(section, notebook, [])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        seconds = time.perf_counter() - start
        launches = log.read_text().splitlines() if log.is_file() else []
    on = {b: sum(1 for line in launches if line.split()[1] == b) for b in ("nccl", "gloo")}
    print(
        f"\n{section}: {len(tests) - len(failed)} of {len(tests)} tests passed in "
        f"{seconds:.0f} s; launches: {on['nccl']} on NCCL, {on['gloo']} on gloo"
    )
    for reason in sorted({line.split(" ", 2)[2] for line in launches if " gloo " in line}):
        print(f"  gloo because: {reason}")
    for test, (ename, message, _) in sorted(failed.items()):
        print(f"  FAILED {test}: {ename}: {message.splitlines()[0][:300] if message else ''}")
    return {
        "section": section,
        "tests": len(tests),
        "failed": sorted(failed),
        "launches_nccl": on["nccl"],
        "launches_gloo": on["gloo"],
        "seconds": seconds,
    }


# --- training project ----------------------------------------------------------------------

_THROUGHPUT = re.compile(r"throughput ([\d.e+]+) tokens/s over (\d+) steps, ([\d.e+]+) FLOPs")


def train_report(
    parallel: str,
    ranks: int,
    size_args: tuple[str, ...],
    steps: int,
    batch: int,
    peak: float | None,
) -> dict:
    """``torchrun`` the project's trainer; its tokens/s and MFU against ``peak`` TFLOP/s."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        "distopt.project.train",
        "--parallel",
        parallel,
        "--steps",
        str(steps),
        "--batch-size",
        str(batch),
        "--throughput",
        "--log-every",
        str(steps),
        *size_args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    found = _THROUGHPUT.search(done.stdout)
    if done.returncode or not found:
        tail = (done.stdout + done.stderr)[-2000:]
        print(f"\ntraining, {parallel} on {ranks}: FAILED (exit {done.returncode})\n{tail}")
        return {"parallel": parallel, "ranks": ranks, "failed": True}
    tokens_s, flops = float(found.group(1)), float(found.group(3))
    mfu = tokens_s * flops / (ranks * peak * 1e12) if peak else None
    last = [line for line in done.stdout.splitlines() if "stopped after" in line]
    print(
        f"\ntraining, {parallel} on {ranks} rank{'s' * (ranks > 1)}: {tokens_s:,.0f} tokens/s "
        f"({tokens_s / ranks:,.0f} per rank), {flops:.3g} FLOPs/token, MFU "
        + (f"{100 * mfu:.1f} % of {peak:g} TFLOP/s per GPU" if mfu else "unknown (no peak)")
        + (f"; {last[0]}" if last else "")
    )
    return {
        "parallel": parallel,
        "ranks": ranks,
        "tokens_s": tokens_s,
        "flops_per_token": flops,
        "mfu": mfu,
        "batch": batch,
        "steps": steps,
    }


# --- the whole check -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autograder.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sections", nargs="*", help="default: every section")
    parser.add_argument("--skip-exercises", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak")
    parser.add_argument(
        "--rehearse-on-cpu",
        action="store_true",
        help="run every step on gloo with small sizes (tries the script)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    info = machine()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    if not info["gpus"] and not args.rehearse_on_cpu:
        print(
            "No CUDA device here: nothing to run. Run `make gpu-check` on a GPU node "
            "(docs/instructors.md, 'On a GPU node'); `--rehearse-on-cpu` tries every step on gloo."
        )
        return 0
    cpu = args.rehearse_on_cpu
    backend = "gloo" if cpu else "auto"
    gpus = 2 if cpu else info["gpus"]
    peak = args.peak_tflops or info.get("peak_bf16_tflops")
    results: dict = {"machine": info}
    if gpus >= 2:
        results["allreduce"] = allreduce_report(
            min(gpus, 8),
            CPU_SIZES if cpu else ALLREDUCE_SIZES,
            10 if cpu else 20,
            "gloo" if cpu else "nccl",
        )
    else:
        print("\nall_reduce: one GPU, and NCCL needs a GPU per rank: alpha and beta need 2 GPUs.")
    if not args.skip_exercises:
        sections = args.sections or course.sections()
        results["exercises"] = [exercise_report(s, backend) for s in sections]
    if not args.skip_train:
        size = CPU_TRAIN_ARGS if cpu else TRAIN_ARGS
        batch = 8 * gpus if not cpu else 8
        results["train"] = [
            train_report(parallel, gpus, size, 12 if cpu else 20, batch, peak)
            for parallel in ("ddp", "fsdp")
        ]
    failed = [t for r in results.get("exercises", []) for t in r["failed"]]
    failed += [r["parallel"] for r in results.get("train", []) if r.get("failed")]
    print(f"\ngpu-check: {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
