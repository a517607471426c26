"""make gpu-check (autograder/gpu_check.py) on a machine without CUDA: it says so and runs
nothing; its pieces (the alpha-beta fit, the peak table, the timed all-reduce on gloo, the
trainer's throughput line) work here the way they will on a GPU node."""

from __future__ import annotations

import pytest
import torch

from autograder import gpu_check
from distopt import launch
from distopt.project import train
from distopt.project.gpt import GPTConfig, flops_per_token
from distopt.project.loop import TrainConfig


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_and_exits_0_running_nothing(capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing may run without CUDA")

    for name in ("allreduce_report", "exercise_report", "train_report"):
        monkeypatch.setattr(gpu_check, name, refuse)
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert "gpus 0" in out and "No CUDA device here: nothing to run" in out


def test_the_fit_recovers_alpha_and_the_bus_bandwidth():
    alpha, beta, n = 25e-6, 180e9, 4
    sizes = [2**k for k in range(13, 28, 2)]
    seconds = [alpha + 2 * (n - 1) / n * s / beta for s in sizes]
    fit_alpha, fit_beta = gpu_check.fit_alpha_beta(sizes, seconds, n)
    assert fit_alpha == pytest.approx(alpha, rel=1e-6) and fit_beta == pytest.approx(beta, rel=1e-6)
    with pytest.raises(ValueError, match="does not grow with size"):
        gpu_check.fit_alpha_beta(sizes, seconds[::-1], n)
    with pytest.raises(ValueError, match="2 or more ranks"):
        gpu_check.fit_alpha_beta(sizes, seconds, 1)


@pytest.mark.parametrize(
    "name, peak",
    [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
     ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA GeForce RTX 4090", None)],
)  # fmt: skip
def test_the_peak_is_looked_up_by_device_name(name, peak):
    assert gpu_check.peak_tflops(name) == peak


def test_the_timed_all_reduce_runs_on_gloo_and_every_rank_reports_the_slowest():
    sizes = (4096, 65536)
    medians = launch(gpu_check.allreduce_times, 2, sizes, 3, backend="gloo", timeout=60)
    assert medians[0] == medians[1] and len(medians[0]) == 2 and min(medians[0]) > 0


def test_the_trainers_throughput_line_counts_tokens_after_the_warm_up():
    config = TrainConfig(model=GPTConfig(vocab_size=16, seq_len=32, n_layer=2, d_model=64),
                         batch_size=8, steps=5, warmup_steps=1)  # fmt: skip
    line = train._throughput_line([0.0, 1.0, 1.5, 2.0, 2.5], config)
    # timed from the end of step 2 to the end of step 5: 3 steps of 8 x 32 tokens in 1.5 s
    assert (
        line
        == f"throughput 512 tokens/s over 3 steps, {flops_per_token(config.model):.6g} FLOPs/token"
    )
    assert gpu_check._THROUGHPUT.search(line).groups() == (
        "512",
        "3",
        f"{flops_per_token(config.model):.6g}",
    )
    assert "too few steps" in train._throughput_line([0.0, 1.0], config)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_the_slurm_script_runs_make_gpu_check_which_exits_0_without_cuda(tmp_path):
    import os
    import subprocess

    from autograder import course

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["SLURM_SUBMIT_DIR"] = str(course.ROOT)
    env["GPU_CHECK_ARGS"] = "--skip-train"
    script = course.ROOT / "autograder" / "cluster" / "gpu-check.sbatch"
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--json gpu-check.json --skip-train" in done.stdout, done.stdout
    assert "No CUDA device here: nothing to run" in done.stdout, done.stdout
    assert not (course.ROOT / "gpu-check.json").exists()  # nothing ran, nothing written
