"""`make lab` brings up JupyterLab on notebooks/ (its page answers over HTTP)."""

import os
import re
import selectors
import signal
import subprocess
import time

import requests

from tests.helpers import ROOT

STARTUP_S = 90


SERVED = re.compile(r"(http://127\.0\.0\.1:\d+)/lab")


def _served_url(lab: subprocess.Popen, deadline: float) -> str | None:
    """The address JupyterLab logs once it listens (port 0: the OS picked a free one)."""
    selector = selectors.DefaultSelector()
    selector.register(lab.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline and lab.poll() is None:
        if selector.select(timeout=0.5):
            line = lab.stdout.readline()
            if match := SERVED.search(line):
                return match.group(1)
    return None


def test_make_lab_serves_jupyterlab():
    # Port 0: the server binds a port the OS chose, so no other program can take it first.
    args = "LAB_ARGS=--no-browser --ip=127.0.0.1 --port=0 --ServerApp.token= --ServerApp.password="
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
        url = _served_url(lab, deadline)
        assert url is not None, f"JupyterLab did not start within {STARTUP_S} s"
        page = None
        while page is None and time.monotonic() < deadline:
            try:  # the address is logged a moment before the server accepts connections
                page = requests.get(f"{url}/lab", timeout=10)
            except requests.ConnectionError:
                time.sleep(0.5)
        assert page is not None, f"JupyterLab logged {url} but did not answer there"
        assert page.status_code == 200
        assert "JupyterLab" in page.text
        tree = requests.get(f"{url}/api/contents", timeout=10).json()
        names = {item["name"] for item in tree["content"]}
        assert "02_memory_sharding" in names, "JupyterLab should open on notebooks/"
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
