"""Least privilege for student code: the kernel that runs a submission starts in a sandbox.

nbgrader starts one Jupyter kernel per notebook. The grader's kernel manager
(:mod:`autograder.kernels`) wraps that kernel's command line, given the :class:`Policy` of the
submission (:func:`policy_for`), with :func:`wrap`::

    setpriv --pdeathsig KILL unshare --net --mount --pid --fork --kill-child --mount-proc \\
        python sandbox.py POLICY.json -- python -m ipykernel_launcher -f k.json

and talks to it over unix sockets (``transport = "ipc"``): a kernel in its own network
namespace cannot reach the grader's 127.0.0.1. Inside the namespaces, this file (as
``__main__``, still root, PID 1 of the new PID namespace):

* brings up the namespace's own loopback (torch.distributed needs it; nothing else is
  reachable: no route, no DNS), and names its IPv6 addresses in a private /etc/hosts (so that
  c10d's reverse look-ups succeed instead of warning on stderr),
* hides every course root (tmpfs over it) except the kernel's own working folder and the
  Python environment, so solutions/, hidden tests, the gradebook and other students'
  submissions cannot be read; the notebook being graded (which holds the restored hidden
  tests) reads as empty; gives the kernel private empty /tmp, /var/tmp and /dev/shm,
* joins the kernel's control group (autograder.bounds: memory and tasks of the whole
  submission, where the machine has cgroups),
* forks the kernel with resource limits (address space, CPU seconds, processes, file size,
  open files, no core dumps) under a uid of its own with no capabilities, and reaps every
  process left behind; when the kernel exits, the PID namespace and everything in it go.
  Where the policy names the run's zygote (:mod:`autograder.zygote`), the zygote forks the
  kernel into these namespaces instead, with torch and the rest already imported, under
  the same limits and uid; PID 1 waits for it and passes interrupts on.

:func:`probe` says whether this machine allows it (root, or unprivileged user namespaces,
and util-linux's ``unshare``/``setpriv``); when it does not, grading goes on without the
sandbox and the report says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RUNTIME = Path("/run/autograder-kernels")  # connection files and unix sockets of kernels
UIDS = RUNTIME / "uids"  # the kernel uids held by graders on this machine (autograder.bounds)
GIB = 2**30
MIB = 2**20


@dataclass
class Limits:
    """Resource limits of each kernel process (setrlimit; children inherit them), and of the
    whole submission where the machine has cgroups (autograder.bounds)."""

    address_space_bytes: int = 4 * GIB  # virtual memory of one process: memory bombs fail
    cpu_seconds: int = 600  # CPU time of one process: a backstop to the per-cell timeout
    processes: int = 256  # processes and threads of the kernel's own uid: fork bombs fail
    file_bytes: int = 64 * MIB  # largest file the kernel may write
    open_files: int = 1024
    tmp_bytes: int = 256 * MIB  # size of the private /tmp and /dev/shm
    memory_bytes: int = 8 * GIB  # memory of the whole submission: 2-4 ranks and their children
    tasks: int = 512  # processes and threads of the whole submission


@dataclass
class Policy:
    """What one kernel may see: its own folder and the environment, nothing else of a course."""

    hidden_roots: list[str]  # course roots to hide entirely (their solutions/, autograder/)
    visible: list[str]  # folders inside hidden roots the kernel still needs (read-only)
    workdir: str  # the kernel's working folder (autograded/<student>/<section>), writable
    uid: int = 0  # the kernel's uid and gid; 0 means "pick one"
    limits: Limits = field(default_factory=Limits)
    cgroup_procs: list[str] = field(default_factory=list)  # groups the kernel's tree joins
    zygote: str = ""  # socket of the run's autograder.zygote, which forks kernels warm

    @classmethod
    def from_json(cls, text: str) -> Policy:
        data = json.loads(text)
        data["limits"] = Limits(**data.get("limits", {}))
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def runtime_folder(path: Path = RUNTIME) -> Path:
    """``path`` (the runtime folder of kernels and zygotes), made if missing: kernels may pass
    through it to their own folder, not list it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o711)
    return path


def policy_for(workdir: Path, course_root: Path, *, also_hidden: Iterable[Path] = ()) -> Policy:
    """What a kernel grading in ``workdir`` (inside ``course_root``) may see.

    The course root is hidden, and so are the repository that ``distopt`` was installed from
    (if it is a course: it has ``solutions/``) and the home folder holding the interpreter;
    the Python environment and the package's folder stay visible, read-only. Existing
    folders in ``also_hidden`` (e.g. a database's unix socket folder) are hidden too.
    """
    import importlib.util

    hidden = {course_root, *(Path(p) for p in also_hidden if Path(p).is_dir())}
    visible = {Path(sys.prefix), Path(sys.base_prefix)}
    # Kernels start as sys.executable: where the environment is reached through a link (a
    # course folder's .venv linking to a shared one), that path is shown too, not only the
    # link's target, or the kernel's own python would be hidden with the course root.
    links = {Path(os.path.abspath(p)) for p in (sys.prefix, Path(sys.executable).parent.parent)}
    spec = importlib.util.find_spec("distopt")
    if spec and spec.origin:
        package_parent = Path(spec.origin).resolve().parents[1]  # e.g. <repo>/shared
        visible.add(package_parent)
        if (package_parent.parent / "solutions").is_dir():  # the course's own repository
            hidden.add(package_parent.parent)
    home = Path.home()
    if Path(sys.base_prefix).resolve().is_relative_to(home):
        hidden.add(home)  # e.g. /root/.pyenv: the interpreter stays visible, the rest not
    shown = {str(p.resolve()) for p in visible} | {str(p) for p in links if p.resolve() != p}
    return Policy(
        hidden_roots=sorted(str(p.resolve()) for p in hidden),
        visible=sorted(shown),
        workdir=str(workdir),
    )


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/bin/{name}", f"/usr/sbin/{name}") if Path(p).is_file()),
        None,
    )


def probe() -> str | None:
    """None if kernels can be sandboxed here, else why not (one line)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces (this is {sys.platform})"
    missing = [name for name in ("unshare", "setpriv", "mount") if _tool(name) is None]
    if missing:
        return f"the sandbox needs util-linux's {', '.join(missing)}, not found"
    if os.geteuid() != 0:
        return "the sandbox needs root (mount namespaces and a separate uid per kernel)"
    done = subprocess.run(
        [_tool("unshare"), *UNSHARE_FLAGS, "true"], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        return f"unshare is refused here: {(done.stderr.strip() or 'no reason given')[:160]}"
    return None


UNSHARE_FLAGS = [
    "--net",
    "--mount",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--propagation",
    "private",
]


def wrap(kernel_cmd: list[str], policy: Policy) -> list[str]:
    """The command line that starts ``kernel_cmd`` inside the sandbox described by ``policy``."""
    return [
        _tool("setpriv"),
        "--pdeathsig",
        "KILL",  # the grader dies: so does the sandbox (unshare then kills PID 1)
        _tool("unshare"),
        *UNSHARE_FLAGS,
        sys.executable,
        str(Path(__file__).resolve()),
        policy.to_json(),
        "--",
        *kernel_cmd,
    ]


# --- inside the namespaces (this file run as a script) --------------------------------------


def _mount(*args: str) -> None:
    subprocess.run([_tool("mount"), *args], check=True, capture_output=True)


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, request)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def _loopback_names() -> None:
    """Name the IPv6 loopback addresses in the namespace's /etc/hosts.

    torch.distributed's store looks up the name of each client that connects; on a dual-stack
    socket the client is ``::ffff:127.0.0.1``, which the host's /etc/hosts rarely names, and
    with no DNS in the namespace the lookup fails "temporarily": c10d then writes a warning to
    stderr, and nbgrader scores a test cell with stderr output as failed. The kernel sees a
    copy of /etc/hosts with those names added (read-only, on a tmpfs of its own).
    """
    etc = Path("/run/autograder-etc")
    etc.mkdir(exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=64k,mode=755", "tmpfs", str(etc))
    hosts = Path("/etc/hosts")
    text = hosts.read_text() if hosts.is_file() else "127.0.0.1 localhost\n"
    if not text.endswith("\n"):
        text += "\n"
    named = {line.split()[0] for line in text.splitlines() if line.split() and line[0] != "#"}
    for address in ("::1", "::ffff:127.0.0.1"):
        if address not in named:
            text += f"{address} localhost\n"
    (etc / "hosts").write_text(text)
    if hosts.is_file():
        _mount("--bind", str(etc / "hosts"), str(hosts))
        _mount("-o", "remount,bind,ro", str(hosts))


def _hide(policy: Policy) -> None:
    """Private /tmp, /var/tmp, /dev/shm; course roots replaced by their allowed parts."""
    stash = Path("/run/autograder-sandbox")
    stash.mkdir(exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=1m,mode=700", "tmpfs", str(stash))
    # What stays visible is set aside first: it may live under a root or /tmp about to go.
    keep = [(Path(p), False) for p in policy.visible] + [(Path(policy.workdir), True)]
    for i, (path, _) in enumerate(keep):
        (stash / str(i)).mkdir()
        _mount("--rbind", str(path), str(stash / str(i)))
    size = f"size={policy.limits.tmp_bytes}"
    for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
        if Path(tmp).is_dir():
            _mount("-t", "tmpfs", "-o", f"{size},mode=1777,nosuid,nodev", "tmpfs", tmp)
    for root in map(Path, policy.hidden_roots):
        root.mkdir(parents=True, exist_ok=True)  # it may have lived in the old /tmp
        _mount("-t", "tmpfs", "-o", "size=1m,mode=755", "tmpfs", str(root))
    for i, (path, writable) in enumerate(keep):
        path.mkdir(parents=True, exist_ok=True)
        _mount("--rbind", str(stash / str(i)), str(path))
        if not writable:
            _mount("-o", "remount,bind,ro", str(path))
    # nbgrader wrote the notebook it is running, hidden tests restored, into the working
    # folder: the kernel sees it empty.
    for notebook in Path(policy.workdir).glob("*.ipynb"):
        _mount("--bind", "/dev/null", str(notebook))
    for i in range(len(keep)):
        subprocess.run([_tool("umount"), "-l", str(stash / str(i))], capture_output=True)
    subprocess.run([_tool("umount"), "-l", str(stash)], capture_output=True)


def _limit(limits: Limits) -> None:
    import resource

    for name, value in (
        ("RLIMIT_AS", limits.address_space_bytes),
        ("RLIMIT_CPU", limits.cpu_seconds),
        ("RLIMIT_NPROC", limits.processes),
        ("RLIMIT_FSIZE", limits.file_bytes),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _drop_privileges(uid: int) -> None:
    import ctypes

    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    pr_set_no_new_privs = 38
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_no_new_privs, 1, 0, 0, 0)


def _run_kernel(policy: Policy, argv: list[str]) -> int:
    """Start the kernel as PID 1's child; reap everything; return the kernel's exit status."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the kernel
    kernel = os.fork()
    if kernel == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ["JPY_PARENT_PID"] = "1"  # its parent is PID 1 of the namespace: no poller
        os.chdir(policy.workdir)
        _limit(policy.limits)
        _drop_privileges(policy.uid)
        os.execvp(argv[0], argv)
    while True:
        pid, status = os.wait()
        if pid == kernel:
            return os.waitstatus_to_exitcode(status)


def _run_kernel_in_zygote(policy: Policy, argv: list[str]) -> int | None:
    """Have the zygote fork the kernel into these namespaces (autograder.zygote); its exit
    status, or None when none was started (no zygote to reach, or it failed first)."""
    import signal
    import socket
    import struct

    request = json.dumps({"policy": policy.to_json(), "argv": argv, "env": dict(os.environ)})
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(policy.zygote)
        data = request.encode()
        socket.send_fds(conn, [struct.pack("!I", len(data))], [0, 1, 2])
        conn.sendall(data)
        reply = conn.makefile("r")
        if reply.readline() != "started\n":
            conn.close()
            return None
    except OSError:
        return None
    # The kernel has a session of its own: interrupts and terminations that reach this
    # process's group go on to every process of the namespace. Orphans reap themselves.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: os.kill(-1, signum))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    line = reply.readline()
    return int(line.split()[1]) if line.startswith("exit ") else 1


def main(argv: list[str]) -> int:
    policy = Policy.from_json(argv[1])
    kernel_argv = argv[argv.index("--") + 1 :]
    for procs in policy.cgroup_procs:  # this PID 1 first: everything it starts follows
        Path(procs).write_text(str(os.getpid()))
    _loopback_up()
    _loopback_names()
    _hide(policy)
    if policy.zygote:
        code = _run_kernel_in_zygote(policy, kernel_argv)
        if code is not None:
            return code
    return _run_kernel(policy, kernel_argv)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.exit(code if code >= 0 else 128 - code)
