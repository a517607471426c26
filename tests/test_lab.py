"""`make lab` brings up JupyterLab on notebooks/ (its page answers over HTTP)."""

import os
import signal
import socket
import subprocess
import time

import requests

from tests.helpers import ROOT

STARTUP_S = 90


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_jupyterlab():
    port = _free_port()
    args = (
        f"LAB_ARGS=--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token= "
        "--ServerApp.password= --ServerApp.port_retries=0"
    )
    lab = subprocess.Popen(
        ["make", "--no-print-directory", "lab", args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        page = None
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                page = requests.get(f"http://127.0.0.1:{port}/lab", timeout=5)
                break
            except requests.ConnectionError:
                time.sleep(0.5)
        assert page is not None, f"JupyterLab did not answer within {STARTUP_S} s"
        assert page.status_code == 200
        assert "JupyterLab" in page.text
        tree = requests.get(f"http://127.0.0.1:{port}/api/contents", timeout=5).json()
        names = {item["name"] for item in tree["content"]}
        assert "02_memory_sharding" in names, "JupyterLab should open on notebooks/"
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
