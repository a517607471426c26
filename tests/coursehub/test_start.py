"""`make hub`'s start (coursehub/start.py) before it starts anything, and the students' side
of the lab (coursehub/lab_list.py): the ports it needs, its refusal when one is taken, the
students' JupyterLab defaults, and the Assignment List's state of each submission.

The hub started on its defaults is e2e/test_coursehub.py::test_make_hub_starts_on_its_defaults.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coursehub import lab_list, settings, start


def test_the_default_ports_are_all_different():
    ports = [port for port, _, _ in settings.PORTS]
    assert len(set(ports)) == len(ports) == 3
    config = (settings.HERE / "jupyterhub_config.py").read_text()
    assert "settings.HUB_PORT" in config and "settings.PROXY_API_PORT" in config


def test_a_taken_port_is_named_with_its_variable_and_nothing_starts(monkeypatch, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        monkeypatch.setattr(
            settings,
            "PORTS",
            [(free, "the public address", "COURSEHUB_PORT"),
             (port, "the proxy's REST API", "COURSEHUB_PROXY_API_PORT")],
        )  # fmt: skip
        monkeypatch.setattr(start, "setup", lambda *_: pytest.fail("setup ran"))
        monkeypatch.setattr(subprocess, "Popen", lambda *_, **__: pytest.fail("started"))
        assert start.main(["--section", "01_data_parallel"]) == 2
    err = capsys.readouterr().err
    assert f"port {port} (the proxy's REST API) is taken" in err, err
    assert "COURSEHUB_PROXY_API_PORT" in err and f"{free}" not in err, err


def test_two_settings_on_one_port_are_refused(monkeypatch):
    monkeypatch.setattr(
        settings, "PORTS", [(8000, "a", "COURSEHUB_PORT"), (8000, "b", "COURSEHUB_HUB_PORT")]
    )
    problems = start.taken_ports()
    assert any("8000 is set both for a and for b" in p and "COURSEHUB_HUB_PORT" in p
               for p in problems), problems  # fmt: skip


def test_students_get_no_news_prompt_and_the_state_list(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "STUDENT_CONFIG", tmp_path / "config")
    monkeypatch.setattr(settings, "EXCHANGE", tmp_path / "exchange")
    start.write_student_config()
    defaults = json.loads(
        (tmp_path / "config" / "labconfig" / "default_setting_overrides.json").read_text()
    )
    notes = defaults["@jupyterlab/apputils-extension:notification"]
    assert notes == {"fetchNews": "false", "checkForUpdates": False}
    # and JupyterLab's server reads it from the students' JUPYTER_CONFIG_PATH
    code = (
        "from jupyterlab_server.settings_utils import _get_overrides;"
        "print(_get_overrides('/nonexistent')[0]"
        "['@jupyterlab/apputils-extension:notification']['fetchNews'])"
    )
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(tmp_path / "config"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "false", done.stdout + done.stderr
    config = (tmp_path / "config" / "nbgrader_config.py").read_text()
    assert "c.ExchangeFactory.list = 'coursehub_lab_list.StateList'" in config


def test_the_lab_list_module_imports_nothing_of_the_course():
    """Students' servers cannot read the checkout: the module must stand alone."""
    code = (
        "import sys, importlib.util as u;"
        f"s = u.spec_from_file_location('coursehub_lab_list', {str(Path(lab_list.__file__))!r});"
        "m = u.module_from_spec(s); s.loader.exec_module(m);"
        "print(sorted(k for k in sys.modules if k.startswith(('coursehub', 'autograder'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_assignment_list_shows_each_submissions_state(tmp_path, monkeypatch):
    """nbgrader's own list of a student's submissions (its cache, as the lab's Assignment
    List asks for it), each line with the state the grading service wrote."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    section = "01_data_parallel"
    home, cache = tmp_path / "home", tmp_path / "cache"
    stamps = {
        "graded": "2026-12-05 10:00:00.123456 UTC",
        "late": "2026-12-05 13:00:00.000001 UTC",
        "waiting": "2026-12-05 13:05:00.5 UTC",
        "silent": "2026-12-05 13:06:00.0 UTC",
    }
    heads = {
        "graded": f"# {section}: graded, 11.0 of 22.0 points",
        "late": f"# {section}: late, not graded",
        "waiting": f"# {section}: waiting, graded at 2026-12-05 13:10:00 UTC",
    }
    for key, stamp in stamps.items():
        sub = cache / "distopt" / f"ann+{section}+{stamp}"
        sub.mkdir(parents=True)
        (sub / "data_parallel.ipynb").write_text("{}")
        (sub / "timestamp.txt").write_text(stamp)
        if key in heads:
            folder = home / section / "feedback" / stamp
            folder.mkdir(parents=True)
            (folder / "result.md").write_text(heads[key] + "\n\nmore words\n")
    (home / section / "feedback" / stamps["graded"] / "data_parallel.html").write_text("<p>")
    config = Config()
    config.CourseDirectory.course_id = "distopt"
    config.Exchange.cache = str(cache)
    config.Exchange.root = str(tmp_path / "exchange")
    config.Exchange.assignment_dir = str(home)
    config.ExchangeList.cached = True
    (tmp_path / "exchange").mkdir()
    monkeypatch.chdir(home)
    lister = lab_list.StateList(
        coursedir=CourseDirectory(config=config),
        authenticator=Authenticator(config=config),
        config=config,
    )
    [assignment] = lister.start()
    lines = {s["timestamp"]: s for s in assignment["submissions"]}
    assert sorted(lines) == [
        "2026-12-05 10:00:00 UTC: graded, 11.0 of 22.0 points",
        "2026-12-05 13:00:00 UTC: late, not graded",
        "2026-12-05 13:05:00 UTC: waiting, graded at 2026-12-05 13:10:00 UTC",
        f"2026-12-05 13:06:00 UTC: {lab_list.RECEIVED}",
    ]
    graded = lines["2026-12-05 10:00:00 UTC: graded, 11.0 of 22.0 points"]
    assert graded["has_local_feedback"]  # the lab links its folder: "(view feedback)"
    assert graded["local_feedback_path"].endswith(f"feedback/{stamps['graded']}")


def test_a_hub_that_stopped_leaves_no_proxy_behind(tmp_path, monkeypatch):
    """A hub that failed after starting its proxy (a port taken between the check and its
    bind) leaves the proxy running; make hub stops it, and the hub's process group."""
    monkeypatch.setattr(settings, "STATE", tmp_path)
    proxy = subprocess.Popen(
        ["bash", "-c", "exec -a configurable-http-proxy sleep 120"], start_new_session=True
    )
    try:
        (tmp_path / "proxy.pid").write_text(str(proxy.pid))
        hub = subprocess.Popen(
            ["bash", "-c", "sleep 120 & exit 3"], start_new_session=True
        )  # the hub exited; a child of its process group lingers
        assert hub.wait() == 3
        time.sleep(0.2)
        stopped = start.leftovers(hub)
        assert f"the proxy (pid {proxy.pid})" in stopped
        assert proxy.wait(timeout=15) is not None
        with pytest.raises(ProcessLookupError):
            for _ in range(50):  # the lingering child is gone with the group
                os.killpg(hub.pid, 0)
                time.sleep(0.1)
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()
