"""A throw-away one-node Slurm cluster for the tests: slurmctld and slurmd run as root in the
foreground, with their configuration, state, spool, logs and pid files in a temporary folder
and ports of their own (``SLURM_CONF`` points at it: pass :attr:`Cluster.env` to ``sbatch``
and friends). munge's daemon is started too unless one already runs, and stopped only if it
was started here. :meth:`Cluster.stop` ends every process started through the cluster, jobs
included."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")


def _program(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).is_file()), None
    )


def why_not() -> str | None:
    """None if a cluster can be started here, else why not (a sentence saying what to do)."""
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd runs jobs as their user); run as root"
    missing = [name for name in (*PROGRAMS, "munged", "munge", "setpriv") if _program(name) is None]
    if missing:
        return (
            f"Slurm or munge is not installed ({', '.join(missing)} not found; make test "
            "installs Debian's slurm-wlm and munge when run as root)"
        )
    if not MUNGE_KEY.is_file():
        return f"munge has no key ({MUNGE_KEY}): reinstall munge or run create-munge-key"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no user munge to run munged as: reinstall Debian's munge"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mib() -> int:
    """This machine's memory (what slurmd finds), so that jobs may ask for some (--mem)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1


def _config(folder: Path, host: str) -> str:
    cpus = os.cpu_count() or 1
    return f"""\
ClusterName=test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MailProg=/bin/true
# sbatch --wait then polls every 2 s (it waits 4 times longer each time, up to 32 s, while
# the wait is under a third of MinJobAge, 300 s by default: 2, 10, 42, 74 s, ...)
MinJobAge=6
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mib()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _munge_works() -> bool:
    """Whether a munged answers on the default socket."""
    done = subprocess.run(
        [_program("munge"), "-n"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return done.returncode == 0


@dataclass
class Cluster:
    folder: Path  # slurm.conf, state, spool, logs, pid files
    env: dict[str, str]  # os.environ with SLURM_CONF: for sbatch, sinfo, scontrol, ...
    daemons: list[subprocess.Popen] = field(default_factory=list)  # slurmctld, slurmd
    munged: subprocess.Popen | None = None  # None: it ran already, or not started yet

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def run(self, *command: str, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("env", self.env)
        return subprocess.run(list(command), text=True, **kwargs)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')}"
            for path in sorted((self.folder / "log").glob("*"))
        )

    def _ours(self) -> list[int]:
        """Processes other than this one whose environment names this cluster's SLURM_CONF:
        the daemons, slurmstepd and every job's processes (they inherit it)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Cancel the jobs, shut the daemons down, kill what is left; remove the folder."""
        if any(p.poll() is None for p in self.daemons):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.run(_program("scancel"), "--full", "--user=root", timeout=10)
                self.run(_program("scontrol"), "shutdown", timeout=10)
        deadline = time.monotonic() + 5  # about 9 s right after jobs were cancelled: kill then
        while any(p.poll() is None for p in self.daemons) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(3):  # a job's processes may fork while they are being killed
            for pid in self._ours():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for process in [*self.daemons, self.munged]:  # munged last, and only if it is ours
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _start_munged(cluster: Cluster, deadline: float) -> None:
    munge = pwd.getpwnam("munge")
    MUNGE_RUN.mkdir(parents=True, exist_ok=True)
    os.chown(MUNGE_RUN, munge.pw_uid, munge.pw_gid)
    with (cluster.folder / "log" / "munged.out").open("w") as output:
        process = subprocess.Popen(
            [_program("setpriv"), f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}"]
            + [f"--groups={munge.pw_gid}", _program("munged"), "--foreground", "--force"]
            + [f"--log-file={cluster.folder / 'log' / 'munged.log'}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    cluster.munged = process
    while not _munge_works():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("munged did not start")
        time.sleep(0.1)


def start(timeout_s: float = 60) -> Cluster:
    """Start a one-node cluster; raise RuntimeError with its logs if it is not idle in time."""
    folder = Path(tempfile.mkdtemp(prefix="slurm-test-"))
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir()
    # munged (as munge) writes its log here
    with contextlib.suppress(KeyError):
        os.chown(folder / "log", pwd.getpwnam("munge").pw_uid, grp.getgrnam("munge").gr_gid)
    folder.chmod(0o755)
    (folder / "slurm.conf").write_text(_config(folder, socket.gethostname().split(".")[0]))
    cluster = Cluster(folder, dict(os.environ, SLURM_CONF=str(folder / "slurm.conf")))
    deadline = time.monotonic() + timeout_s
    try:
        if not _munge_works():
            _start_munged(cluster, deadline)
        for daemon in ("slurmctld", "slurmd"):  # in the foreground: ours to end
            with (folder / "log" / f"{daemon}.out").open("w") as output:
                cluster.daemons.append(
                    subprocess.Popen(
                        [_program(daemon), "-D"],
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        env=cluster.env,
                        cwd=folder,
                        start_new_session=True,
                    )
                )
        while True:
            state = cluster.run(_program("sinfo"), "-h", "-o", "%t", timeout=10).stdout.strip()
            if state == "idle":
                return cluster
            if any(p.poll() is not None for p in cluster.daemons):
                raise RuntimeError(f"a daemon exited (node state {state!r})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node is {state!r}, not idle, after {timeout_s} s")
            time.sleep(0.2)
    except BaseException as exc:  # KeyboardInterrupt too: nothing may be left running
        logs = cluster.logs()
        cluster.stop()
        if isinstance(exc, (RuntimeError, OSError, subprocess.SubprocessError)):
            raise RuntimeError(f"the Slurm cluster did not start: {exc}\n{logs}") from exc
        raise


@contextlib.contextmanager
def running(timeout_s: float = 60) -> Iterator[Cluster]:
    """A started cluster, stopped (and every process of it ended) when the block ends."""
    cluster = start(timeout_s)
    try:
        yield cluster
    finally:
        cluster.stop()
