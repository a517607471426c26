"""distopt.machine: the CPU described and measured, and the autocast choice that follows."""

import pytest
import torch

from distopt import machine


def test_the_report_describes_this_cpu():
    report = machine.cpu_report()
    assert report.capability == torch.backends.cpu.get_cpu_capability()
    assert report.float32_flop_per_s > 1e8 and report.bfloat16_flop_per_s > 0
    text = report.summary()
    assert report.name in text and report.capability in text and "GFLOP/s" in text
    assert machine.cpu_report() is report, "measured once per process"


def test_autocast_follows_the_measured_speed(monkeypatch):
    fast = machine.CpuReport("cpu", "AVX512", ["avx512_bf16"], 50e9, 100e9)
    slow = machine.CpuReport("cpu", "AVX2", [], 50e9, 1e9)
    assert fast.bf16_usable and not slow.bf16_usable
    assert "natively" in fast.summary() and "emulated" in slow.summary()
    monkeypatch.setattr(machine, "_REPORT", fast)
    assert machine.autocast_dtype() == "bfloat16"
    monkeypatch.setattr(machine, "_REPORT", slow)
    assert machine.autocast_dtype() == "float32"
    assert machine.autocast_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="only bfloat16"):
        machine.autocast_dtype("float16")


def test_the_threshold_is_far_from_both_cases():
    """Measured: about 2x float32 with avx512_bf16, 0.02x emulated (AVX2 only)."""
    assert 0.05 < machine.BF16_USABLE_RATIO < 1.0
