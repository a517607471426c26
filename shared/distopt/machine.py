"""What the reader's CPU can do, detected and measured at run time.

The notebooks describe the machine they run on, not the one they were recorded on: the CPU's
name and vector extensions as torch sees them, and measured matrix-multiplication rates.
:func:`autocast_dtype` decides whether bfloat16 autocast is worth it here: on a CPU without
bfloat16 instructions (AVX2-only x86, older ARM) torch emulates bfloat16 matrix products,
tens of times slower than float32, so a training run would take minutes instead of seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "CpuReport",
    "NominalPeak",
    "autocast_dtype",
    "cpu_report",
    "matmul_flop_per_s",
    "nominal_peak",
]

# bfloat16 counts as usable when its matrix product runs at least this fraction of float32's
# speed. Measured: about 2x float32 with avx512_bf16, 3-8x with AMX, 0.01-0.05x emulated, so
# the threshold sits far from both and a busy machine cannot flip the decision.
BF16_USABLE_RATIO = 0.3


def matmul_flop_per_s(dtype: torch.dtype, n: int = 512, repeats: int = 5) -> float:
    """Best-of-repeats FLOP/s of one n x n @ n x n product in dtype (2 n^3 FLOPs each)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # first call: allocation and kernel selection
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * n**3 / best_s


@dataclass(frozen=True)
class CpuReport:
    """The CPU as torch sees it, plus measured float32 and bfloat16 matmul rates."""

    name: str  # as cpuinfo reports it, e.g. "AMD EPYC"
    capability: str  # the ATen kernel set in use: "DEFAULT", "AVX2", "AVX512", ...
    bf16_instructions: list[str]  # avx512_bf16, amx_bf16 (x86) where present
    float32_flop_per_s: float  # 256 x 256 matmul, one thread of this process
    bfloat16_flop_per_s: float

    @property
    def bf16_usable(self) -> bool:
        return self.bfloat16_flop_per_s >= BF16_USABLE_RATIO * self.float32_flop_per_s

    def summary(self) -> str:
        extensions = ", ".join(self.bf16_instructions) or "none found"
        verdict = (
            "bfloat16 runs natively: the training runs use bfloat16 autocast"
            if self.bf16_usable
            else "bfloat16 is emulated here: the training runs fall back to float32"
        )
        return (
            f"CPU: {self.name}; ATen kernels: {self.capability}; bfloat16 instructions: "
            f"{extensions}\n256 x 256 matmul: float32 {self.float32_flop_per_s / 1e9:.1f} "
            f"GFLOP/s, bfloat16 {self.bfloat16_flop_per_s / 1e9:.1f} GFLOP/s "
            f"({self.bfloat16_flop_per_s / self.float32_flop_per_s:.2f}x) -> {verdict}"
        )


_REPORT: CpuReport | None = None


def cpu_report() -> CpuReport:
    """Detect and measure once per process (about 0.1 s; repeated calls are free)."""
    global _REPORT
    if _REPORT is None:
        capabilities = (
            torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
        )
        _REPORT = CpuReport(
            name=str(capabilities.get("cpu_name", "unknown CPU")),
            capability=torch.backends.cpu.get_cpu_capability(),
            bf16_instructions=[k for k in ("avx512_bf16", "amx_bf16") if capabilities.get(k)],
            float32_flop_per_s=matmul_flop_per_s(torch.float32, n=256),
            bfloat16_flop_per_s=matmul_flop_per_s(torch.bfloat16, n=256),
        )
    return _REPORT


# Assumed for the nominal peak: two fused multiply-add pipes per core, each as wide as the
# widest vector extension found (true of recent Intel and AMD server and desktop cores; some
# cores, e.g. AMD Zen 4, run 512-bit instructions as two 256-bit halves: half this peak).
FMA_UNITS = 2
# bfloat16 FLOPs per cycle and core of Intel's AMX tile unit (a 16 x 32 by 32 x 16 product of
# bfloat16 tiles takes 16 cycles: 16 * 16 * 32 multiply-adds, 1024 FLOPs per cycle).
AMX_BF16_FLOP_PER_CYCLE = 1024


@dataclass(frozen=True)
class NominalPeak:
    """A data-sheet style peak of one core, computed from what the CPU reports: an estimate."""

    flop_per_s: float
    flop_per_cycle: int
    clock_hz: float
    how: str  # the arithmetic, in words

    def describe(self) -> str:
        return (
            f"{self.flop_per_s / 1e9:.0f} GFLOP/s per core = {self.flop_per_cycle} FLOPs/cycle "
            f"({self.how}) x {self.clock_hz / 1e9:.2f} GHz"
        )


def _clock_hz(cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """The clock Linux reports for the first core (its base or current clock, not turbo)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1]) * 1e6
    except (OSError, ValueError):
        return None
    return None


def nominal_peak(
    dtype: torch.dtype, capabilities: dict | None = None, clock_hz: float | None = None
) -> NominalPeak | None:
    """The peak FLOP/s of one core in ``dtype``, from its vector width, FMA pipes and clock.

    float32: 2 FLOPs per multiply-add x (vector bits / 32) lanes x :data:`FMA_UNITS` pipes per
    cycle. bfloat16: twice float32's rate with ``avx512_bf16`` (a dot product of pairs),
    :data:`AMX_BF16_FLOP_PER_CYCLE` with AMX tiles, and None where bfloat16 is emulated (no
    native peak). None also where the clock is unknown (not Linux). An estimate: turbo clocks
    run higher, and cores that split wide instructions reach half.
    """
    if capabilities is None:
        capabilities = (
            torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
        )
    clock_hz = _clock_hz() if clock_hz is None else clock_hz
    if not clock_hz:
        return None
    bits = 512 if capabilities.get("avx512_f") else 256 if capabilities.get("avx2") else 128
    lanes = bits // 32
    float32_per_cycle = 2 * lanes * FMA_UNITS
    float32_how = f"2 x {lanes} float32 lanes ({bits}-bit) x {FMA_UNITS} FMA pipes"
    if dtype == torch.float32:
        per_cycle, how = float32_per_cycle, float32_how
    elif dtype == torch.bfloat16 and capabilities.get("amx_bf16"):
        per_cycle, how = AMX_BF16_FLOP_PER_CYCLE, "AMX bfloat16 tiles"
    elif dtype == torch.bfloat16 and capabilities.get("avx512_bf16"):
        per_cycle, how = 2 * float32_per_cycle, f"avx512_bf16 pairs: 2 x [{float32_how}]"
    else:
        return None
    return NominalPeak(per_cycle * clock_hz, per_cycle, clock_hz, how)


def autocast_dtype(preferred: str = "bfloat16") -> str:
    """preferred where this CPU computes it at a usable speed, else "float32".

    The training configurations take a dtype string (``TrainConfig.dtype``); the notebooks
    pass ``autocast_dtype()`` so that the recipe's bfloat16 is used where it is real.
    """
    if preferred == "float32":
        return preferred
    if preferred != "bfloat16":
        raise ValueError(f"only bfloat16 is checked for speed here, got {preferred!r}")
    return preferred if cpu_report().bf16_usable else "float32"
