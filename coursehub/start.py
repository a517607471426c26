"""`make hub`: set up and start the course server; Ctrl-C (or SIGTERM) stops all of it.

    python -m coursehub.start [--section S ...] [--setup-only]

1. the proxy from the npm registry into coursehub/node_modules (pinned in package.json);
2. as root: a Unix account for each student (COURSEHUB_STUDENTS), and the instructor's files
   (solutions/, tests/, autograder/) closed to everyone else;
3. nbgrader's exchange in coursehub/state/exchange and the students' nbgrader configuration
   (the exchange, the course id; the instructor's extensions switched off for them);
4. the sections released into the exchange from notebooks/ (what `make release` builds);
5. JupyterHub (coursehub/jupyterhub_config.py), which starts the proxy and the grading service.

Before any of it, each port it binds (settings.PORTS) must be free: if one is taken it says
which, what binds it and the variable that moves it, and starts nothing. When the hub stops,
for whatever reason, whatever it started and left behind (its proxy above all) is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from coursehub import instructor, settings

PRIVATE = ["solutions", "tests", "autograder"]  # reference answers, hidden tests, grades
# The Assignment List's view of a student's submissions with their state (coursehub/lab_list.py),
# put into the students' environment under this name (students cannot import coursehub/).
LAB_LIST_MODULE = "coursehub_lab_list"
# JupyterLab's defaults for every student: no "Jupyter news" prompt, no update check.
LAB_DEFAULTS = {
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    }
}


def taken_ports() -> list[str]:
    """A sentence for each port of settings.PORTS that another program holds (or that two of
    the settings share)."""
    problems, seen = [], {}
    for port, what, variable in settings.PORTS:
        if port in seen:
            problems.append(
                f"port {port} is set both for {seen[port]} and for {what}: set {variable} "
                "to a port of its own"
            )
            continue
        seen[port] = what
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                problems.append(
                    f"port {port} ({what}) is taken by another program: stop it "
                    f"(`ss -ltnp 'sport = :{port}'` names it) or set {variable} to a free port"
                )
    return problems


def install_proxy() -> None:
    if settings.PROXY.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("make hub needs Node.js and npm for JupyterHub's proxy (apt-get install npm)")
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--no-save"], cwd=settings.HERE, check=True
    )


def reachable_by_all(path: Path) -> bool:
    """Whether any account may run this file: world-searchable folders all the way down."""
    path = path.resolve()
    return all(os.stat(p).st_mode & 0o001 for p in path.parents) and bool(
        os.stat(path).st_mode & 0o005
    )


def make_student_env() -> None:
    """A venv every account can run, whose packages are the course's .venv's."""
    if settings.STUDENT_PYTHON.exists():
        return
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [Path(sys.base_prefix) / "bin" / f"python{version}"]
    candidates += [Path(d) / f"python{version}" for d in ("/usr/bin", "/usr/local/bin")]
    base = next((p for p in candidates if p.exists() and reachable_by_all(p)), None)
    if base is None:
        sys.exit(
            f"no Python {version} that every account can run (the .venv's is "
            f"{sys.base_prefix}): install python{version} system-wide"
        )
    subprocess.run(
        [str(base), "-m", "venv", "--without-pip", str(settings.STUDENT_ENV)], check=True
    )
    purelib = sysconfig.get_paths()["purelib"]  # the course's .venv, where this runs
    site = next(settings.STUDENT_ENV.glob("lib/python*/site-packages"))
    (site / "course_env.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    if not reachable_by_all(Path(purelib)):
        print(f"warning: {purelib} is closed to other accounts: students' servers cannot start")


def add_accounts(names: list[str]) -> None:
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        home = pwd.getpwnam(name).pw_dir
        os.chmod(home, 0o700)  # no student reads another's home


def write_student_config() -> None:
    cfg = settings.STUDENT_CONFIG
    (cfg / "labconfig").mkdir(parents=True, exist_ok=True)
    (cfg / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(settings.EXCHANGE)!r}\n"
        f"c.CourseDirectory.course_id = {settings.COURSE_ID!r}\n",
        encoding="utf-8",
    )
    # students see the assignment list and Validate, not the instructor's tools
    (cfg / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {
                    "jpserver_extensions": {
                        "nbgrader.server_extensions.formgrader": False,
                        "nbgrader.server_extensions.course_list": False,
                    }
                }
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    (cfg / "labconfig" / "page_config.json").write_text(
        json.dumps(
            {
                "disabledExtensions": {
                    "@jupyter/nbgrader:formgrader": True,
                    "@jupyter/nbgrader:create-assignment": True,
                    "@jupyter/nbgrader:course-list": True,
                }
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    (cfg / "labconfig" / "default_setting_overrides.json").write_text(
        json.dumps(LAB_DEFAULTS, indent=1), encoding="utf-8"
    )
    # the Assignment List shows each submission's state (graded, late, waiting): see lab_list
    (cfg / "nbgrader_config.py").write_text(
        (cfg / "nbgrader_config.py").read_text(encoding="utf-8")
        + f"c.ExchangeFactory.list = {LAB_LIST_MODULE + '.StateList'!r}\n",
        encoding="utf-8",
    )
    for path in [cfg, cfg / "labconfig", *cfg.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def install_lab_list() -> None:
    """coursehub/lab_list.py into the students' environment (it imports only nbgrader)."""
    site = next(settings.STUDENT_ENV.glob("lib/python*/site-packages"))
    target = site / f"{LAB_LIST_MODULE}.py"
    shutil.copyfile(settings.HERE / "lab_list.py", target)
    os.chmod(target, 0o644)


def setup(sections: list[str]) -> None:
    install_proxy()
    make_student_env()
    install_lab_list()
    settings.STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.STATE, 0o711)  # students pass through to the exchange, list nothing
    settings.EXCHANGE.mkdir(exist_ok=True)
    os.chmod(settings.EXCHANGE, 0o777)  # nbgrader's own exchange permissions below it
    write_student_config()
    if os.getuid() == 0:
        add_accounts(settings.STUDENTS)
        for name in PRIVATE:
            path = settings.ROOT / name
            if path.is_dir():
                os.chmod(path, 0o700)
    else:
        print("not root: no Unix accounts made; students must already have accounts")
    for section in sections:
        print(instructor.nbgrader("release", section, "--force").stderr.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--section", action="append", default=[], help="release these (default: all)"
    )
    parser.add_argument("--setup-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.setup_only:
        problems = taken_ports()
        if problems:
            print("make hub cannot start; nothing was started:", file=sys.stderr)
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
            return 2
    sections = args.section or sorted(
        p.name for p in (settings.ROOT / "notebooks").iterdir() if p.is_dir()
    )
    setup(sections)
    if args.setup_only:
        return 0
    print(
        f"course server on http://127.0.0.1:{settings.PORT}/ for {', '.join(settings.STUDENTS)}"
        f" (demo password: {settings.PASSWORD}); Ctrl-C stops it"
    )
    hub = subprocess.Popen(
        [
            str(settings.PYTHON.parent / "jupyterhub"),
            "-f",
            str(settings.HERE / "jupyterhub_config.py"),
        ],
        cwd=settings.STATE,
        env=dict(os.environ, PYTHONPATH=str(settings.HERE.parent)),
        start_new_session=True,  # its own process group: what it leaves behind can be found
    )
    signal.signal(signal.SIGTERM, lambda *_: hub.send_signal(signal.SIGTERM))
    try:
        try:
            return hub.wait()
        except KeyboardInterrupt:
            hub.send_signal(signal.SIGINT)  # the hub stops its servers, service and proxy
            return hub.wait()
    finally:
        left = leftovers(hub)
        if left:
            print(f"stopped what the hub left running: {', '.join(left)}", file=sys.stderr)


def _cmdline(pid: int) -> bytes:
    """The command line of a live process, empty if there is none (or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def leftovers(hub: subprocess.Popen) -> list[str]:
    """Stop what a stopped hub left running: its proxy (pid file), and its process group.
    A hub that fails to start (a port taken after the check) otherwise leaves the proxy up."""
    stopped = []
    try:
        proxy = int((settings.STATE / "proxy.pid").read_text().strip())
    except (OSError, ValueError):
        proxy = 0
    if proxy and b"configurable-http-proxy" in _cmdline(proxy):
        os.kill(proxy, signal.SIGTERM)
        stopped.append(f"the proxy (pid {proxy})")
    try:
        os.killpg(hub.pid, signal.SIGTERM)
        stopped.append(f"the hub's process group ({hub.pid})")
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while proxy and b"configurable-http-proxy" in _cmdline(proxy):
        if time.monotonic() > deadline:
            os.kill(proxy, signal.SIGKILL)
            break
        time.sleep(0.2)
    try:
        os.killpg(hub.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return stopped


if __name__ == "__main__":
    sys.exit(main())
