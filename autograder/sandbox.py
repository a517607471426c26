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
* builds the kernel's view of the files from an **allow list** and makes it the root
  (``pivot_root``, the old root detached): the system's programs, libraries and
  configuration (:data:`SYSTEM`, read-only), the devices, ``/sys`` (read-only) and a ``/proc``
  of the namespace, the Python environment and the package's folder (read-only), the
  kernel's own working folder and its runtime folder (writable), and private empty /tmp,
  /var/tmp and /dev/shm. Nothing else of the machine exists for the kernel: no course root,
  no other checkout or last term's course, no home folder, no /work, /srv, /opt, /root.
  Course roots inside an allowed folder are still laid over with an empty tmpfs, and the
  notebook being graded (which holds the restored hidden tests) reads as empty,
* joins the kernel's control group (autograder.bounds: memory and tasks of the whole
  submission, where the machine has cgroups),
* forks the kernel with resource limits (address space, CPU seconds, processes, file size,
  open files, no core dumps) under a uid of its own with no capabilities, and reaps every
  process left behind; when the kernel exits, the PID namespace and everything in it go.
  Where the policy names the run's zygote (:mod:`autograder.zygote`), the zygote forks the
  kernel into these namespaces instead, with torch and the rest already imported, under
  the same limits and uid; PID 1 waits for it and passes interrupts on.

:func:`probe` says whether this machine allows it (root, or unprivileged user namespaces,
and util-linux's ``unshare``/``setpriv``/``pivot_root``); when it does not, grading goes on
without the sandbox and the report says so.
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
    """What one kernel may see besides the system (:data:`SYSTEM`): the environment
    (``visible``, read-only), its own folder and runtime folder; nothing else of the machine."""

    hidden_roots: list[str]  # course roots: empty even where an allowed folder holds one
    visible: list[str]  # the allow list beyond the system: the environment, the package
    workdir: str  # the kernel's working folder (autograded/<student>/<section>), writable
    uid: int = 0  # the kernel's uid and gid; 0 means "pick one"
    limits: Limits = field(default_factory=Limits)
    cgroup_procs: list[str] = field(default_factory=list)  # groups the kernel's tree joins
    zygote: str = ""  # socket of the run's autograder.zygote, which forks kernels warm
    runtime: str = ""  # the kernel's connection file and sockets' folder (else from ``-f``)

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
    missing = [
        name for name in ("unshare", "setpriv", "mount", "pivot_root") if _tool(name) is None
    ]
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

# What every kernel sees of the system, read-only, where it exists: programs, libraries and
# their configuration (the dynamic loader's cache, /etc/hosts, certificates, time zones). A
# link among them (``/lib -> usr/lib``) is made again as a link.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
NEW_ROOT = Path("/run/autograder-root")  # where the kernel's root is built (a tmpfs)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_MNT_DETACH = 2


def _sys_mount(source: str, target: Path | str, fstype: str = "", flags: int = 0,
               data: str = "") -> None:  # fmt: skip
    """mount(2), without starting a process for each mount (a kernel start makes about 20)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    args = [x.encode() if x else None for x in (source, str(target), fstype)]
    if libc.mount(*args, flags, data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or fstype} on {target}: {os.strerror(errno)}")


def _folders_to(path: Path) -> None:
    """Make ``path`` and the folders above it that are missing, each one that the kernel may
    pass through but not list (0711): ``/work`` of the kernel's view shows no names, even
    of what is mounted inside it."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o711)
        folder.chmod(0o711)


def _bind(source: Path, target: Path, *, writable: bool) -> None:
    """``source`` (with everything mounted under it) at ``target``, read-only unless
    ``writable`` (the flag is set on the top mount; the kernel's uid owns none of the rest)."""
    _folders_to(target if source.is_dir() else target.parent)
    if not source.is_dir() and not target.exists():
        target.touch()
    _sys_mount(str(source), target, flags=_MS_BIND | _MS_REC)
    if not writable:
        _sys_mount("", target, flags=_MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID)


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, request)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def _hosts_text() -> str:
    """The host's /etc/hosts with the IPv6 loopback addresses named.

    torch.distributed's store looks up the name of each client that connects; on a dual-stack
    socket the client is ``::ffff:127.0.0.1``, which the host's /etc/hosts rarely names, and
    with no DNS in the namespace the lookup fails "temporarily": c10d then writes a warning to
    stderr, and nbgrader scores a test cell with stderr output as failed. The kernel sees this
    text as its /etc/hosts (read-only).
    """
    hosts = Path("/etc/hosts")
    text = hosts.read_text() if hosts.is_file() else "127.0.0.1 localhost\n"
    if not text.endswith("\n"):
        text += "\n"
    named = {line.split()[0] for line in text.splitlines() if line.split() and line[0] != "#"}
    for address in ("::1", "::ffff:127.0.0.1"):
        if address not in named:
            text += f"{address} localhost\n"
    return text


def _runtime_of(policy: Policy, argv: list[str]) -> Path | None:
    """The kernel's runtime folder: its connection file's (``-f FILE``), where it binds its
    unix sockets."""
    if policy.runtime:
        return Path(policy.runtime)
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "-f":
            return Path(value).parent
    return None


def allowed(policy: Policy, runtime: Path | None = None) -> list[tuple[Path, bool]]:
    """What the kernel sees besides the system (:data:`SYSTEM`), devices and its private
    folders: (path, writable), in mounting order (a folder before what lies inside it)."""
    shown = [(Path(p), False) for p in policy.visible]
    shown.append((Path(policy.workdir), True))
    if runtime is not None:
        shown.append((runtime, True))
    system = [Path(p) for p in SYSTEM]
    # Folders the system's mounts already show (the environment under /usr) are not bound
    # again; nested folders (a venv inside a shown one) come after their parents.
    kept = [
        (path, writable)
        for path, writable in shown
        if writable or not any(path.is_relative_to(s) for s in system)
    ]
    return sorted(dict.fromkeys(kept), key=lambda item: len(item[0].parts))


def _build_view(policy: Policy, runtime: Path | None) -> None:
    """Make the kernel's root from the allow list and switch to it (see the module doc)."""
    root = NEW_ROOT
    root.mkdir(mode=0o755, exist_ok=True)
    _sys_mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for name in SYSTEM:
        path = Path(name)
        if path.is_symlink():
            (root / name.lstrip("/")).symlink_to(os.readlink(path))
        elif path.is_dir():
            _bind(path, root / name.lstrip("/"), writable=False)
    (root / "etc-hosts").write_text(_hosts_text())
    if Path("/etc/hosts").is_file():
        _bind(root / "etc-hosts", root / "etc" / "hosts", writable=False)
    _bind(Path("/dev"), root / "dev", writable=True)  # device nodes keep their own modes
    if Path("/sys").is_dir():
        _bind(Path("/sys"), root / "sys", writable=False)
    (root / "proc").mkdir()
    _sys_mount("proc", root / "proc", "proc", _MS_NOSUID | _MS_NODEV)
    # First: an allowed folder may lie in the old /tmp (a test's working folder).
    tmp = f"size={policy.limits.tmp_bytes},mode=1777"
    for name in ("tmp", "var/tmp", "dev/shm"):
        (root / name).mkdir(parents=True, exist_ok=True)
        _sys_mount("tmpfs", root / name, "tmpfs", _MS_NOSUID | _MS_NODEV, tmp)
    for path, writable in allowed(policy, runtime):
        if path.exists():
            _bind(path, root / str(path).lstrip("/"), writable=writable)
    # A course root inside an allowed folder (a course kept in the environment's folder):
    # empty, but for what the allow list shows inside it.
    inner = [p for p, _ in allowed(policy, runtime)]
    for hidden in map(Path, policy.hidden_roots):
        inside = root / str(hidden).lstrip("/")
        if inside.is_dir() and not any(p.is_relative_to(hidden) for p in inner):
            _sys_mount("tmpfs", inside, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    # nbgrader wrote the notebook it is running, hidden tests restored, into the working
    # folder: the kernel sees it empty.
    for notebook in Path(policy.workdir).glob("*.ipynb"):
        _sys_mount("/dev/null", root / str(notebook).lstrip("/"), flags=_MS_BIND)
    (root / "etc-hosts").unlink()  # its mount at /etc/hosts keeps it
    old = root / ".old-root"
    old.mkdir()
    subprocess.run([_tool("pivot_root"), str(root), str(old)], check=True, capture_output=True)
    os.chdir("/")
    import ctypes

    if ctypes.CDLL(None, use_errno=True).umount2(b"/.old-root", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "umount /.old-root")
    os.rmdir("/.old-root")
    _sys_mount("", "/", flags=_MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


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


def _connect(path: str):
    """A connection to the zygote's socket, or None where it cannot be reached. Made before
    the kernel's view of the files is built: its socket is not part of that view."""
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def _run_kernel_in_zygote(policy: Policy, argv: list[str], conn=None) -> int | None:
    """Have the zygote fork the kernel into these namespaces (autograder.zygote) over
    ``conn`` (else a connection made now); its exit status, or None when none was started
    (no zygote to reach, or it failed first)."""
    import signal
    import socket
    import struct

    request = json.dumps({"policy": policy.to_json(), "argv": argv, "env": dict(os.environ)})
    try:
        conn = conn or _connect(policy.zygote)
        if conn is None:
            return None
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
    conn = _connect(policy.zygote) if policy.zygote else None
    _build_view(policy, _runtime_of(policy, kernel_argv))
    if conn is not None:
        code = _run_kernel_in_zygote(policy, kernel_argv, conn)
        if code is not None:
            return code
    return _run_kernel(policy, kernel_argv)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.exit(code if code >= 0 else 128 - code)
