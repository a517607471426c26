"""Imported once by the launcher's fork server, so that ranks start without importing torch.

``distopt.launch`` starts its ranks from a *fork server*: a fresh, single-threaded process
(never a fork of the Jupyter kernel, which runs threads) that imports torch once and then
forks a child per rank. A rank then starts in milliseconds instead of the seconds a fresh
interpreter spends importing torch, which is most of what a small launch costs.

The server's own output goes nowhere: each rank points its output at its log file first
thing (``distopt.engine.rank``), and nothing the server prints belongs in a notebook cell.
"""

import os

_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
os.close(_null)

import torch  # noqa: E402  (after the redirection: torch may print while it loads)
import torch._dynamo  # noqa: E402, F401  (imported by the first optimizer step: 1.5 s)
import torch.distributed  # noqa: E402, F401

torch.set_num_threads(1)
