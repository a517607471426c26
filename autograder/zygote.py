"""Warm kernel starts: sandboxed kernels forked from one process that has done the imports.

Every graded kernel used to start as a fresh interpreter and import ipykernel, numpy, torch,
matplotlib and distopt: about 3 CPU-seconds per submission before a single test ran, and
most of the grader's cost on a small class. One grading run now starts a *zygote* (this file
run as a script, as root, in the grader's namespaces) that imports all of that once and then
only waits. For each kernel, the sandbox's PID 1 (:mod:`autograder.sandbox`, already inside
the kernel's namespaces with its view of the files hidden) connects to the zygote's socket and
hands over its standard streams, the kernel's command line, environment and policy; the
zygote forks a *waiter* for that request, which

* joins the kernel's control groups and PID 1's network, mount and PID namespaces (setns),
* forks the kernel, which drops to the policy's uid with the policy's limits exactly as a
  freshly started kernel does, and runs ipykernel in place of ``python -m ipykernel_launcher``,
* waits for the kernel and tells PID 1 its exit status, which PID 1 returns as its own.

The zygote imports what the graded sections' reference notebooks import (their set-up cells,
answers and tests: :func:`modules_for`), and with torch what the first rank launch and
optimizer step import and every module of distopt. A section that never imports torch (the
autograder's catalogue) gets a zygote without it, which starts in half a second instead of
four. What a kernel shares with the zygote is what it would have imported anyway. The zygote
itself never reads a request (its waiters do) nor runs student code; its socket sits in a
folder only root may enter, and a waiter serves only a root peer. When the zygote cannot be
reached, or fails before the kernel is forked, PID 1 starts the kernel the cold way.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

# What every kernel imports (ipykernel; numpy for a fresh random seed).
PRELOAD = ("ipykernel.kernelapp", "numpy")
# Imported with torch: what the first rank launch and optimizer step import (1.5 s of it is
# torch._dynamo); distopt's modules are added then too.
WITH_TORCH = ("torch.distributed", "torch._dynamo")
# Imported with matplotlib: pyplot and the inline backend ipykernel selects.
WITH_MATPLOTLIB = ("matplotlib.pyplot", "matplotlib_inline.backend_inline")
# Modules of distopt that are not imported: the fork server's own (it redirects this process's
# output), the torchrun entry and the explorers (widgets, loaded only by the explorer pages).
SKIPPED = ("distopt.engine.preload", "distopt.project.train", "distopt.explore")
SOCKET_NAME = "zygote.sock"
_ROOT = str(Path(__file__).resolve().parents[1])  # the course root holding autograder/


# --- the grader side ----------------------------------------------------------------------


class Zygote:
    """The zygote of one grading run (a context manager): kernels' policies name ``socket``.

    Its output goes to the run's log; it is killed when the block ends, or with the grader.
    """

    def __init__(
        self, log_path: str, runtime: Path | None = None, modules: Iterable[str] = ()
    ) -> None:
        from autograder import course, sandbox

        runtime = sandbox.runtime_folder(runtime or sandbox.RUNTIME)
        self.folder = Path(
            tempfile.mkdtemp(prefix=f"zygote-p{os.getpid()}-", dir=runtime)
        )  # 0700: root only
        self.socket = str(self.folder / SOCKET_NAME)
        # Its own home and matplotlib folder: what imports write goes where no kernel looks.
        env = {**course.tool_env(), "HOME": str(self.folder), "MPLCONFIGDIR": str(self.folder)}
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"import sys; sys.path.insert(0, {_ROOT!r}); "
                 "from autograder import zygote; zygote.serve(sys.argv[1], sys.argv[2:])",
                 self.socket, *modules],
                env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,  # the grader's interrupts are not for it
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        finally:
            os.close(log)

    def ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the zygote serves (it has done its imports); False if it died first."""
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


# --- the zygote ---------------------------------------------------------------------------


def modules_for(sections: Iterable[str]) -> list[str]:
    """The modules the sections' reference notebooks import, by name (``from a import b``
    gives ``a`` and ``a.b``, which may be a module), for :class:`Zygote`'s ``modules``."""
    import ast

    import nbformat

    from autograder import course

    found: set[str] = set()
    for section in sections:
        for path in sorted((course.SOLUTIONS / section).glob("*.ipynb")):
            try:
                cells = nbformat.read(path, as_version=4).cells
            except Exception:  # nothing to preload; generate_assignment says what is wrong
                continue
            for cell in cells:
                if cell.cell_type != "code":
                    continue
                lines = cell.source.splitlines()
                code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
                try:
                    tree = ast.parse(code)
                except SyntaxError:
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        found.update(alias.name for alias in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        found.add(node.module)
                        found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(found)


def serve(socket_path: str, modules: list[str]) -> None:
    """Import ``modules`` and what goes with them, then fork a waiter per connection; in a
    kernel, run the kernel."""
    from autograder import sandbox  # now: the kernel will not see the course's files

    # What the sandbox gives every kernel, read by ipykernel's traits when it is imported.
    os.environ["JPY_PARENT_PID"] = "1"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # as ipykernel sets
    _preload(modules)
    # Everything imported so far stays for the zygote's life: out of the collector's sight,
    # a kernel's full collections (IPython runs one at exit) walk only the student's objects.
    gc.collect()
    gc.freeze()
    if len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("zygote: an import started a thread; forking would not be safe")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path + ".new")  # renamed once listening: it exists, it serves
    os.chmod(socket_path + ".new", 0o600)
    server.listen(64)
    os.rename(socket_path + ".new", socket_path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters reap themselves
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            break
        conn.close()
    server.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _wait_for(conn)  # returns in the kernel only
    conn.detach()  # closed with every other inherited descriptor
    _become_kernel(request, fds, sandbox)


def _preload(modules: list[str]) -> None:
    import importlib
    import pkgutil

    for name in PRELOAD:
        importlib.import_module(name)
    for name in modules:
        if name.startswith(SKIPPED):
            continue
        try:
            importlib.import_module(name)
        except ImportError:  # a name imported from a module, not a module; or not installed
            pass
    if "matplotlib" in sys.modules:
        for name in WITH_MATPLOTLIB:
            importlib.import_module(name)
    if "torch" in sys.modules:
        for name in WITH_TORCH:
            importlib.import_module(name)
        import distopt

        for info in pkgutil.walk_packages(distopt.__path__, "distopt.", onerror=lambda n: None):
            if not info.name.startswith(SKIPPED):
                importlib.import_module(info.name)


def _end_control_thread(app) -> None:
    """End the kernel's control thread while its IOPub thread still runs.

    ipykernel's exit handler (``IPKernelApp.close``) stops the IOPub thread and then joins
    the control thread, which may still be flushing its streams after the shutdown request,
    through IOPub: it then waits out its 10-s flush timeout, and the kernel manager terminates
    the kernel after 2.5 s. That happened to about one kernel in 15, 3 s lost each time.
    """
    thread = getattr(app, "control_thread", None)
    if thread is not None and thread.is_alive():
        thread.stop()  # after the request being handled, if any
        thread.join(timeout=5)


def _wait_for(conn: socket.socket) -> tuple[dict, list[int]]:
    """The waiter: take the request, enter PID 1's namespaces, fork the kernel, wait for it."""
    try:
        request, fds = _enter(conn)
    except BaseException as exc:  # no kernel: PID 1 starts it the cold way
        print(f"zygote: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    kernel = os.fork()
    if kernel == 0:
        return request, fds
    try:
        for fd in fds:
            os.close(fd)
        conn.sendall(b"started\n")
        _, status = os.waitpid(kernel, 0)
        conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def _enter(conn: socket.socket) -> tuple[dict, list[int]]:
    """Read the request of a root peer; join its control groups and namespaces."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != 0:
        raise PermissionError("only root (the sandbox's PID 1) may ask for a kernel")
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    size = struct.unpack("!I", head)[0]
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the request was cut short")
        data += chunk
    request = json.loads(data)
    for procs in json.loads(request["policy"]).get("cgroup_procs", []):
        Path(procs).write_text(str(os.getpid()))  # before the mount namespace changes
    libc = ctypes.CDLL(None, use_errno=True)
    for kind in ("net", "pid", "mnt"):  # pid: for the children to come
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            if libc.setns(fd, 0) != 0:
                raise OSError(ctypes.get_errno(), f"setns({kind})")
        finally:
            os.close(fd)
    return request, fds


def _become_kernel(request: dict, fds: list[int], sandbox) -> None:
    """In the forked kernel: the sandbox's limits and uid, then ipykernel as if just started."""
    _die_with_parent()  # the waiter dies: so does the kernel
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    for signum in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ["JPY_PARENT_PID"] = "1"  # as the sandbox sets: no parent to poll
    policy = sandbox.Policy.from_json(request["policy"])
    os.chdir(policy.workdir)
    sandbox._limit(policy.limits)
    sandbox._drop_privileges(policy.uid)
    argv = request["argv"]
    if argv[1:3] != ["-m", "ipykernel_launcher"]:  # not a kernel we preloaded for: start it
        os.execvp(argv[0], argv)
    # What `python -m ipykernel_launcher` would see: none of the grader's modules, no course
    # root on the path (IPython puts the working folder there), fresh random state.
    for name in [m for m in sys.modules if m == "autograder" or m.startswith("autograder.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in (_ROOT, "")]  # IPython adds the folder
    sys.path_importer_cache.clear()
    import atexit

    import numpy
    from ipykernel import kernelapp

    from distopt.engine import fork_server

    # While single-threaded, where torch is loaded: the launcher's fork server (ranks then
    # start warm too) and its resource tracker. (Without torch the server would import it
    # for every kernel; the first launch starts it instead.) Then a session of the kernel's
    # own: at shutdown ipykernel signals the children in its process group and waits seconds
    # for them, and these two end with it.
    if "torch" in sys.modules:
        fork_server.start_here()
    os.setsid()
    numpy.random.seed()
    sys.argv = [kernelapp.__file__, *argv[3:]]
    code = 0
    try:
        kernelapp.launch_new_instance()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    _end_control_thread(kernelapp.IPKernelApp.instance())
    # Exit handlers (IPython's, multiprocessing's), but not Python's teardown of everything
    # the zygote imported, which takes seconds while the grader waits for the kernel to end.
    atexit._run_exitfuncs()
    os._exit(code)
