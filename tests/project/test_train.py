"""distopt.project.train: the torchrun entry point, DDP and FSDP2, accumulation, exact resume,
clear errors."""

import json
import os
import subprocess
import sys


def _torchrun(*args, timeout=90):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += [
        "2",
        "-m",
        "distopt.project.train",
        "--d-model",
        "16",
        "--seq-len",
        "16",
        "--n-layer",
        "1",
    ]
    done = subprocess.run(
        cmd + list(args), capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_torchrun_fsdp_resume_continues_exactly(tmp_path):
    # with gradient accumulation: 2 ranks x 2 micro-batches of 1 sequence
    common = ["--parallel", "fsdp", "--steps", "4", "--batch-size", "4", "--micro-batches", "2"]
    _torchrun(*common, "--checkpoint-dir", str(tmp_path / "whole"))
    _torchrun(*common, "--checkpoint-dir", str(tmp_path / "split"), "--stop-after", "2")
    out = _torchrun(*common, "--checkpoint-dir", str(tmp_path / "split"), "--resume")
    assert "stopped after step 4" in out
    whole = json.loads((tmp_path / "whole" / "meta.json").read_text())
    split = json.loads((tmp_path / "split" / "meta.json").read_text())
    assert split["step"] == whole["step"] == 4
    assert split["history"]["loss"] == whole["history"]["loss"]
    assert split["history"]["grad_norm"] == whole["history"]["grad_norm"]


def test_cli_errors_are_clear(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "distopt.project.train", "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "torchrun" in done.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "distopt.project.train",
            "--resume",
            "--checkpoint-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no checkpoint" in done.stderr
