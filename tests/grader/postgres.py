"""A throw-away PostgreSQL server for the tests: a new cluster in a temporary folder, served
on a unix socket in that folder only (no TCP port), by an unprivileged user (``nobody`` when
the tests run as root: PostgreSQL refuses root), with trust authentication, and no fsync."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROLE = "grader"


def server_programs() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: Debian's newest, else the one on PATH."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def why_not() -> str | None:
    """None if a server can be started here, else why not (a sentence saying what to do)."""
    if server_programs() is None:
        return (
            "PostgreSQL's server is not installed (make test installs Debian's postgresql when "
            "run as root; else: sudo apt-get install postgresql)"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root without util-linux's setpriv to drop to the user nobody"
    return None


@dataclass
class Server:
    folder: Path  # the cluster, its socket and its log
    process: subprocess.Popen

    @property
    def socket_dir(self) -> Path:
        return self.folder / "socket"

    def url(self, database: str) -> str:
        return f"postgresql://{ROLE}@/{database}?host={self.socket_dir}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir), user=ROLE, dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def ready(self) -> bool:
        """Whether the server accepts connections."""
        import psycopg

        try:
            psycopg.connect(
                host=str(self.socket_dir), user=ROLE, dbname="postgres", connect_timeout=2
            ).close()
        except psycopg.OperationalError:
            return False
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(timeout_s: float = 60) -> Server:
    """Initialise a cluster and start its server; raise RuntimeError with its log if it fails."""
    programs = server_programs()
    folder = Path(tempfile.mkdtemp(prefix="gradebook-pg-"))
    folder.chmod(0o755)  # the server's user must reach its folders
    data, sockets = folder / "data", folder / "socket"
    data.mkdir()
    sockets.mkdir()
    drop: list[str] = []
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        for path in (data, sockets):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        drop = [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
        ]
    env = dict(os.environ, LC_ALL="C", HOME=str(folder))
    done = subprocess.run(
        [*drop, str(programs / "initdb"), "-D", str(data), "-U", ROLE, "--auth=trust"]
        + ["--no-locale", "-E", "UTF8", "--no-sync"],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
    )
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(
        [*drop, str(programs / "postgres"), "-D", str(data), "-k", str(sockets)]
        + ["-c", "listen_addresses=", "-c", "fsync=off", "-c", "full_page_writes=off"]
        + ["-c", "synchronous_commit=off"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=folder,
        start_new_session=True,
    )
    server = Server(folder, process)
    deadline = time.monotonic() + timeout_s
    while not server.ready():
        if process.poll() is not None or time.monotonic() > deadline:
            text = (folder / "server.log").read_text()
            server.stop()
            raise RuntimeError(f"the PostgreSQL server did not start:\n{text}")
        time.sleep(0.1)
    return server
