"""Process-wide byte meter: every byte this process sends and receives through hetsync.comm.

Counts are taken at the transport (:mod:`hetsync.comm.p2p`): each completed point-to-point send
or receive adds ``tensor.numel() * tensor.element_size()`` to its operation's counters, so
parameter-server messages include their fixed header (:data:`hetsync.comm.wire.HEADER_BYTES`).
The ``native`` algorithm is the exception: gloo does not expose what it moves, so it is
charged the theoretical bytes of a ring all-reduce (see :func:`ring_bytes`).

Operation names are ``"<family>/<variant>"``, e.g. ``"all_reduce/ring"``, ``"ps/push_pull"``,
``"ps/sum"``. The counters are guarded by a lock, so threads may share them.

Example::

    from hetsync.comm import meter
    meter.reset()
    ...                             # communicate
    sent, recv = meter.totals()     # bytes since the reset
    meter.snapshot()                # {"all_reduce/ring": (sent, recv), ...}
"""

from __future__ import annotations

import threading


class ByteMeter:
    """Thread-safe counters of bytes sent and received, per operation name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def add(self, op: str, sent: int = 0, recv: int = 0) -> None:
        """Add ``sent`` and ``recv`` bytes to operation ``op``."""
        if sent < 0 or recv < 0:
            raise ValueError(f"byte counts must be >= 0, got sent={sent}, recv={recv}")
        with self._lock:
            counts = self._counts.setdefault(op, [0, 0])
            counts[0] += int(sent)
            counts[1] += int(recv)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """A copy of the counters: operation name -> (bytes sent, bytes received)."""
        with self._lock:
            return {op: (c[0], c[1]) for op, c in self._counts.items()}

    def totals(self) -> tuple[int, int]:
        """(bytes sent, bytes received) over all operations."""
        with self._lock:
            return (sum(c[0] for c in self._counts.values()),
                    sum(c[1] for c in self._counts.values()))

    def reset(self) -> None:
        """Forget every count."""
        with self._lock:
            self._counts.clear()


def ring_bytes(numel: int, world_size: int, rank: int, element_size: int) -> tuple[int, int]:
    """Bytes (sent, received) by ``rank`` in a ring all-reduce of ``numel`` elements.

    With the vector cut into ``world_size`` nearly equal chunks of ``c_i`` elements (the first
    ``numel % world_size`` chunks one longer; see :func:`hetsync.comm.topology.chunk_bounds`),
    rank r sends every chunk but its own in the reduce-scatter and every chunk but chunk r+1
    in the all-gather, and receives every chunk but chunk r-1, then every chunk but its own::

        sent = 2 n - c_r - c_{r+1}        recv = 2 n - c_{r-1} - c_r      (indices mod P)

    which is 2(P-1)/P * n elements each way when P divides n. Used for the ``native``
    algorithm, whose real traffic gloo does not report: the count is theoretical.
    """
    if world_size <= 1 or numel == 0:
        return 0, 0
    base, extra = divmod(numel, world_size)

    def c(i: int) -> int:
        return base + (1 if i % world_size < extra else 0)

    sent = 2 * numel - c(rank) - c(rank + 1)
    recv = 2 * numel - c(rank - 1) - c(rank)
    return sent * element_size, recv * element_size


_METER = ByteMeter()


def get_meter() -> ByteMeter:
    """The process-wide meter used by hetsync.comm."""
    return _METER


def add(op: str, sent: int = 0, recv: int = 0) -> None:
    """Add bytes to the process-wide meter (see :meth:`ByteMeter.add`)."""
    _METER.add(op, sent, recv)


def snapshot() -> dict[str, tuple[int, int]]:
    """Operation name -> (bytes sent, bytes received) of the process-wide meter."""
    return _METER.snapshot()


def totals() -> tuple[int, int]:
    """(bytes sent, bytes received) over all operations of the process-wide meter."""
    return _METER.totals()


def reset() -> None:
    """Zero the process-wide meter."""
    _METER.reset()
