"""A fresh clone runs the README's first command: `make lab` builds .venv and serves JupyterLab."""

from __future__ import annotations

import os
import subprocess
import sys

import requests

from e2e.conftest import ARTIFACTS, ROOT, served_url, stop_process_group, wait_for_http

INSTALL_AND_START_S = 900  # pip install of the pinned packages: 1-2 minutes, more on slow CI


def _clean_env() -> dict[str, str]:
    """The caller's environment without this checkout's .venv, as in a new shell."""
    venv_bin = os.path.dirname(sys.executable)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = path
    return env


def test_fresh_clone_make_lab(tmp_path):
    clone = tmp_path / "course"
    # The committed HEAD only: what a student gets from `git clone`.
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    assert not (clone / ".venv").exists()

    lab_args = (
        "LAB_ARGS=--no-browser --ip=127.0.0.1 --port=0 --ServerApp.token= --ServerApp.password="
    )
    log_path = ARTIFACTS / "fresh_clone_make_lab.log"
    ARTIFACTS.mkdir(exist_ok=True)
    with open(log_path, "w") as log:
        lab = subprocess.Popen(
            ["make", "lab", lab_args],
            cwd=clone,
            env=_clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: make, jupyter and kernels stop together
        )
        try:
            url = served_url(log_path, lab, INSTALL_AND_START_S)
            page = wait_for_http(f"{url}/lab", lab, INSTALL_AND_START_S)
            assert "JupyterLab" in page.text
            tree = requests.get(f"{url}/api/contents", timeout=10).json()
            names = {item["name"] for item in tree["content"]}
            assert "02_memory_sharding" in names, f"lab should open on notebooks/: {names}"
        finally:
            stop_process_group(lab)

    imported = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c", "import distopt; print(distopt.__file__)"],
        cwd=clone,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    # Editable install: the clone's own package, not this checkout's.
    assert str(clone) in imported.stdout, imported.stdout
