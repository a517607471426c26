"""Collectives simulated on lists of numpy arrays, one array per worker, with a byte counter.

Worker ``r`` of ``N`` is just index ``r`` of a list. Workers exchange data only through a
:class:`SimulatedNetwork`, which copies each message and counts what every worker sends and
receives, so the algorithms' traffic can be checked against the formulas in
:mod:`distopt.costs.comm`.

The ring algorithms follow Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms
for clusters of workstations": each buffer is cut into N chunks (``np.array_split`` of the
flattened array), and in each of N-1 steps every worker sends one chunk to its right
neighbour ``(r + 1) % N``.

* reduce-scatter: in step s worker r sends chunk ``(r - s - 1) % N``; the receiver adds it to
  its own copy of that chunk. After N-1 steps worker r holds chunk r summed over all workers.
* all-gather: in step s worker r sends chunk ``(r - s) % N``; the receiver stores it. After
  N-1 steps every worker holds every chunk.

Each worker sends (N-1)/N of the buffer in each phase: 2(N-1)/N of it for an all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimulatedNetwork:
    """Point-to-point links between ``world_size`` simulated workers, with byte counters."""

    world_size: int
    bytes_sent: list[int] = field(init=False)  # per worker, bytes it sent so far
    bytes_received: list[int] = field(init=False)  # per worker, bytes it received so far
    messages_sent: list[int] = field(init=False)  # per worker, number of sends
    log: list[tuple[int, int, int]] = field(init=False)  # (src, dst, nbytes) of each send
    payloads: list[np.ndarray] = field(init=False)  # what each send carried, in log's order

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        self.reset()

    def reset(self) -> None:
        """Zero the counters and the log."""
        self.bytes_sent = [0] * self.world_size
        self.bytes_received = [0] * self.world_size
        self.messages_sent = [0] * self.world_size
        self.log = []
        self.payloads = []

    def send(self, src: int, dst: int, array: np.ndarray) -> np.ndarray:
        """Send ``array`` from worker ``src`` to worker ``dst``; return the copy ``dst`` gets.

        The copy is what makes it a message: changing it later does not change the sender's
        array. ``array.nbytes`` is counted on both ends, and a second copy is kept in
        ``payloads`` (so tests can check what each message carried, not only its size).
        """
        for name, rank in (("src", src), ("dst", dst)):
            if not 0 <= rank < self.world_size:
                raise ValueError(f"{name}={rank} is not a worker of 0..{self.world_size - 1}")
        if src == dst:
            raise ValueError(f"worker {src} sends to itself: that is not a message")
        received = np.array(array, copy=True)
        self.bytes_sent[src] += received.nbytes
        self.bytes_received[dst] += received.nbytes
        self.messages_sent[src] += 1
        self.log.append((src, dst, received.nbytes))
        self.payloads.append(received.copy())
        return received


def _network_for(arrays: Sequence[np.ndarray], network: SimulatedNetwork | None):
    if not arrays:
        raise ValueError("need one array per worker, got none")
    if network is None:
        return SimulatedNetwork(len(arrays))
    if network.world_size != len(arrays):
        raise ValueError(f"{len(arrays)} arrays for a network of {network.world_size} workers")
    return network


def split_chunks(array: np.ndarray, world_size: int) -> list[np.ndarray]:
    """The ring's chunks of a buffer: ``np.array_split`` of the flattened array, as copies."""
    return [chunk.copy() for chunk in np.array_split(np.ravel(array), world_size)]


def ring_reduce_scatter(
    arrays: Sequence[np.ndarray], network: SimulatedNetwork | None = None
) -> list[np.ndarray]:
    """Ring reduce-scatter: worker r ends with chunk r of the elementwise sum (1-D).

    ``arrays[r]`` is worker r's buffer; all have the same shape. The inputs are not changed.
    """
    network = _network_for(arrays, network)
    n = len(arrays)
    chunks = [split_chunks(a, n) for a in arrays]
    for step in range(n - 1):
        # Every worker sends before any adds: the messages of one step travel together.
        sent = [(r, (r - step - 1) % n) for r in range(n)]
        received = [network.send(r, (r + 1) % n, chunks[r][c]) for r, c in sent]
        for (r, c), message in zip(sent, received, strict=True):
            chunks[(r + 1) % n][c] += message
    return [chunks[r][r] for r in range(n)]


def ring_all_gather(
    chunks: Sequence[np.ndarray], network: SimulatedNetwork | None = None
) -> list[np.ndarray]:
    """Ring all-gather: worker r contributes ``chunks[r]``; every worker gets them all, joined.

    Returns, per worker, ``np.concatenate(chunks)`` as it arrived over the ring.
    """
    network = _network_for(chunks, network)
    n = len(chunks)
    held: list[list[np.ndarray | None]] = [[None] * n for _ in range(n)]
    for r in range(n):
        held[r][r] = np.array(chunks[r], copy=True)
    for step in range(n - 1):
        sent = [(r, (r - step) % n) for r in range(n)]
        received = [network.send(r, (r + 1) % n, held[r][c]) for r, c in sent]
        for (r, c), message in zip(sent, received, strict=True):
            held[(r + 1) % n][c] = message
    return [np.concatenate(row) for row in held]


def ring_all_reduce(
    arrays: Sequence[np.ndarray], network: SimulatedNetwork | None = None
) -> list[np.ndarray]:
    """Ring all-reduce (sum): a reduce-scatter, then an all-gather of the summed chunks.

    Returns one array per worker, each equal to the elementwise sum and shaped like the input.
    """
    network = _network_for(arrays, network)
    if len(arrays) == 1:
        return [np.array(arrays[0], copy=True)]
    shape = np.shape(arrays[0])
    gathered = ring_all_gather(ring_reduce_scatter(arrays, network), network)
    return [full.reshape(shape) for full in gathered]


def parameter_server_all_reduce(
    arrays: Sequence[np.ndarray], network: SimulatedNetwork | None = None, *, server: int = 0
) -> list[np.ndarray]:
    """The naive all-reduce: everyone sends to one server, which sums and sends the sum back.

    The server receives N-1 whole buffers and sends N-1 copies; the others send one each.
    """
    network = _network_for(arrays, network)
    n = len(arrays)
    total = np.array(arrays[server], copy=True)
    for r in range(n):
        if r != server:
            total += network.send(r, server, arrays[r])
    results = [np.empty_like(total) for _ in range(n)]
    for r in range(n):
        results[r] = total.copy() if r == server else network.send(server, r, total)
    return results
