"""The grader's side of sandboxed kernels: their kernel manager, runtime folders and bounds.

:class:`SandboxedKernelManager` (set as ``Execute.kernel_manager_class`` by the grader, see
autograder/nbgrader_plugins.py) starts each kernel with the command line of
:func:`autograder.sandbox.wrap` when its ``policy`` is configured
(``c.SandboxedKernelManager.policy``: the JSON of a :class:`autograder.sandbox.Policy`, set
by the grader for each submission), claims the kernel's uid and control groups
(:mod:`autograder.bounds`) and talks to it over unix sockets in a folder of its own. What
happens inside the namespaces is :mod:`autograder.sandbox`.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Unicode

from autograder import bounds
from autograder.sandbox import RUNTIME, UIDS, Limits, Policy, runtime_folder, wrap


def runtime_of_process(runtime: Path = RUNTIME) -> Path:
    """Where the kernels this process starts keep their connection files and sockets."""
    return runtime / f"p{os.getpid()}"


def clean_runtime(runtime: Path = RUNTIME) -> None:
    """Remove what kernels of this process left behind (call when none is running)."""
    shutil.rmtree(runtime_of_process(runtime), ignore_errors=True)


def clean_stale_runtimes() -> None:
    """Remove what the kernels and zygotes of processes no longer alive (a killed run) left."""
    for folder in [*RUNTIME.glob("p*"), *RUNTIME.glob("zygote-p*")]:
        pid = folder.name.removeprefix("zygote-").split("-")[0][1:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _hierarchy():
    """Where this machine's kernel groups go, or why nowhere (autograder.bounds.detect)."""
    return bounds.detect()


def bounds_note(limits: Limits | None = None) -> str:
    """How each submission is bounded here, for `make grade`'s first line."""
    limits = limits or Limits()
    return bounds.describe(_hierarchy(), limits.memory_bytes, limits.tasks)


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels start in the sandbox, reached over unix sockets.

    Without a ``policy`` (the grader's ``--no-sandbox``, or a machine without the
    sandbox), kernels start as usual.
    """

    policy = Unicode(
        "", help="JSON of the autograder.sandbox.Policy of the kernels; empty: no sandbox"
    ).tag(config=True)
    runtime_dir = Unicode(
        str(RUNTIME), help="folder of the sandboxed kernels' connection files and sockets"
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._policy = None
        self._claimed_uid, self._cgroup_procs = 0, []
        if self.policy:  # parsed here, so that a bad policy fails before a kernel starts
            try:
                self._policy = Policy.from_json(self.policy)
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"SandboxedKernelManager.policy is not a Policy: {exc}") from exc
        if self._policy is not None:
            self.transport = "ipc"
            runtime = runtime_of_process(runtime_folder(Path(self.runtime_dir)))
            runtime.mkdir(mode=0o711, exist_ok=True)
            self._runtime = Path(tempfile.mkdtemp(prefix="k", dir=runtime))
            self.connection_file = str(self._runtime / "k.json")

    @property
    def sandboxed(self) -> bool:
        """Whether this manager's kernels run in the sandbox, under a uid of their own."""
        return self._policy is not None

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw):
        if self._policy is None:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        policy = Policy.from_json(self._policy.to_json())  # a copy per kernel
        if not policy.uid:
            policy.uid = self._claimed_uid = bounds.claim_uid(UIDS)
        hierarchy = _hierarchy()
        if isinstance(hierarchy, bounds.Hierarchy):
            limits = policy.limits
            procs = bounds.create(hierarchy, f"k{policy.uid}", limits.memory_bytes, limits.tasks)
            policy.cgroup_procs = self._cgroup_procs = [str(p) for p in procs]
        policy.workdir = str(Path(kw.get("cwd") or policy.workdir).resolve())
        policy.runtime = str(self._runtime)  # the only folder of /run the kernel sees
        for path in (self._runtime, Path(self.connection_file), Path(policy.workdir)):
            os.chown(path, policy.uid, policy.uid)
        env = dict(kw.get("env") or os.environ)
        env["HOME"] = "/tmp"
        kw["env"] = env
        return await super()._async_launch_kernel(wrap(kernel_cmd, policy), **kw)

    async def _async_finish_shutdown(
        self, waittime: float | None = None, pollinterval: float = 0.1, restart: bool = False
    ) -> None:
        # jupyter_client asks whether a kernel that was told to shut down has ended every
        # 100 ms: a tenth of a second per submission waiting for a process that ends in a few
        # milliseconds. Asking every 5 ms costs nothing (bench-grade PART=catalogue).
        await super()._async_finish_shutdown(waittime, min(pollinterval, 0.005), restart)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self._policy is not None and not restart:
            shutil.rmtree(self._runtime, ignore_errors=True)
            bounds.remove(self._cgroup_procs)
            if self._claimed_uid:
                bounds.release_uid(UIDS, self._claimed_uid)
            self._cgroup_procs, self._claimed_uid = [], 0
