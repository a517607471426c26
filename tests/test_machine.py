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


AVX512 = {"avx2": True, "avx512_f": True}


def test_the_nominal_float32_peak_is_lanes_times_pipes_times_clock():
    peak = machine.nominal_peak(torch.float32, AVX512, clock_hz=2.5e9)
    # 16 float32 lanes x 2 FLOPs per multiply-add x 2 pipes = 64 FLOPs per cycle
    assert peak.flop_per_cycle == 64
    assert peak.flop_per_s == 64 * 2.5e9
    assert machine.nominal_peak(torch.float32, {"avx2": True}, clock_hz=1e9).flop_per_cycle == 32
    assert machine.nominal_peak(torch.float32, {}, clock_hz=1e9).flop_per_cycle == 16
    assert "160 GFLOP/s per core = 64 FLOPs/cycle" in peak.describe()


def test_the_bfloat16_peak_needs_native_instructions():
    assert machine.nominal_peak(torch.bfloat16, AVX512, clock_hz=1e9) is None  # emulated
    dot = machine.nominal_peak(torch.bfloat16, {**AVX512, "avx512_bf16": True}, clock_hz=1e9)
    assert dot.flop_per_cycle == 128
    amx = {**AVX512, "avx512_bf16": True, "amx_bf16": True}
    assert machine.nominal_peak(torch.bfloat16, amx, clock_hz=1e9).flop_per_cycle == 1024


def test_no_peak_without_a_clock(tmp_path):
    assert machine.nominal_peak(torch.float32, AVX512, clock_hz=0) is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2596.120\n")
    assert machine._clock_hz(cpuinfo) == 2596.120e6
    assert machine._clock_hz(tmp_path / "missing") is None
