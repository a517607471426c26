"""Fixtures for the browser tests: a JupyterLab server on a scratch copy, headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from e2e.lab_page import poll, start_chromium

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the course's .venv/bin: the same jupyter the student runs
ARTIFACTS = ROOT / "artifacts"
STARTUP_S = 120

# JupyterLab user settings for the test server (read from JUPYTERLAB_SETTINGS_DIR):
SETTINGS = {
    # Render every cell (no virtual scrolling), so the DOM holds every prompt and output.
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    # No news or update checks: the test machine has no network, and no toast over the page.
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


SERVED = re.compile(r"(http://127\.0\.0\.1:\d+)/lab")


def served_url(log_path: Path, proc: subprocess.Popen, timeout_s: float) -> str:
    """The address a server started with ``--port=0`` logs once it has bound the port the
    OS chose for it (so no other program can take it between choosing and binding)."""

    def logged():
        assert proc.poll() is None, f"the server exited with code {proc.returncode}"
        match = SERVED.search(log_path.read_text(errors="replace")) if log_path.exists() else None
        return match.group(1) if match else None

    return poll(logged, timeout_s=timeout_s, what=f"the server's address in {log_path}")


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server and its kernels (one process group), SIGKILL if they linger."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float) -> requests.Response:
    def answer():
        assert proc.poll() is None, f"the server exited with code {proc.returncode}"
        try:
            page = requests.get(url, timeout=5)
        except requests.ConnectionError:
            return None
        return page if page.status_code == 200 else None

    return poll(answer, timeout_s=timeout_s, what=f"{url} to answer")


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """A scratch copy of notebooks/ and solutions/: running notebooks writes outputs."""
    root = tmp_path_factory.mktemp("lab_root")
    for folder in ("notebooks", "solutions"):
        shutil.copytree(ROOT / folder, root / folder)
    return root


@pytest.fixture(scope="module")
def lab_url(lab_root, tmp_path_factory):
    """`jupyter lab` on a free port, token off, the app exposed as window.jupyterapp."""
    home = tmp_path_factory.mktemp("lab_home")
    for name, value in SETTINGS.items():
        (home / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "settings" / name).write_text(json.dumps(value))
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        OMP_NUM_THREADS="1",  # as the Makefile: torch.distributed ranks share few cores
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
    )
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [
            str(BIN / "jupyter"),
            "lab",
            f"--ServerApp.root_dir={lab_root}",
            "--ip=127.0.0.1",
            "--port=0",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--no-browser",
            "--allow-root",
            "--LabApp.expose_app_in_browser=True",
        ],
        cwd=lab_root,  # nbgrader's Validate reads nbgrader_config.py from here: none, defaults
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: the kernels stop with the server
    )
    try:
        url = served_url(home / "server.log", proc, STARTUP_S)
        wait_for_http(f"{url}/lab", proc, STARTUP_S)
        yield url
    finally:
        stop_process_group(proc)
        log.close()
        shutil.copy(home / "server.log", _artifact("jupyterlab_server.log"))


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    browser = start_chromium(tmp_path_factory.mktemp("chromium_profile"))
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def stop_kernels(lab_url):
    """After each test, shut down its kernels: two cores cannot run several notebooks at once."""
    yield
    for session in requests.get(f"{lab_url}/api/sessions", timeout=10).json():
        requests.delete(f"{lab_url}/api/sessions/{session['id']}", timeout=30)
    time.sleep(0.5)
