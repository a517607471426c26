"""nbval's kernels talk over unix sockets, not TCP ports on 127.0.0.1.

jupyter_client picks a kernel's five TCP ports by binding port 0 and closing the socket again;
the kernel binds them about a second later, once Python has started. On a busy machine
(pytest-xdist workers, other kernels, torch.distributed ranks opening connections) another
process can take one of those ports in between, and the kernel dies at start: nbval then
reports every cell as "Kernel died before replying to kernel_info". Unix sockets in a folder of
the kernel's own have no such window. (The graded kernels use them too: autograder.sandbox.)

Used as a pytest plugin by `make test`'s nbval run (solutions/conftest.py) and by the
self-check (autograder.check)::

    pytest.main([...], plugins=[ipc])
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from jupyter_client.manager import KernelManager


class IpcKernelManager(KernelManager):
    """A kernel manager whose kernel listens on unix sockets in a private temporary folder."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._sockets = Path(tempfile.mkdtemp(prefix="kernel-"))
        self.transport = "ipc"
        # sockets k-1 ... k-5: short paths, well under the unix socket limit of 107 bytes
        self.ip = str(self._sockets / "k")

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self._sockets, ignore_errors=True)


def pytest_configure(config) -> None:
    """Start every nbval kernel of this pytest run with :class:`IpcKernelManager`."""
    import nbval.kernel

    nbval.kernel.KernelManager = IpcKernelManager
