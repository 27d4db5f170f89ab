"""Ring all-reduce: reduce-scatter then all-gather around a ring, pipelined in segments.

Reference: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1), 2005 (the ring all-gather of section 3 combined with a
ring reduce-scatter; the bandwidth-optimal all-reduce of Patarasuk & Yuan 2009, whose
pipelining by segments is used for long vectors).
"""

from __future__ import annotations

import torch

from . import p2p
from .buffers import scratch
from .p2p import RECV, SEND
from .topology import GroupView, chunk_bounds

def ring_all_reduce(buf: torch.Tensor, view: GroupView, *, op: str, timeout: float) -> None:
    """Sum the 1-D contiguous ``buf`` in place across ``view``'s group, around a ring.

    Works for any group size P and any length n (chunks may be empty when n < P):

    1. Cut ``buf`` into P nearly equal contiguous chunks ``c_0 .. c_{P-1}`` (the first
       ``n % P`` one element longer).
    2. Reduce-scatter, P-1 steps: at step s rank r sends chunk (r-1-s) mod P to rank r+1,
       receives chunk (r-2-s) mod P from rank r-1 into a scratch buffer and adds it to its
       own copy. After the last step rank r holds the full sum of chunk r.
    3. All-gather, P-1 steps: at step s rank r sends chunk (r-s) mod P to rank r+1 and
       receives chunk (r-1-s) mod P from rank r-1 straight into place.

    Long chunks (CPU tensors) are cut into segments (two per chunk, as gloo's own ring, at
    least :data:`hetsync.comm.p2p.SEGMENT_BYTES`; :func:`~hetsync.comm.p2p.piece_elems`)
    and pipelined: a segment received at step s is added and forwarded at
    once, while the next segments are still on the wire (the chunk received at step s is
    the one sent at s+1).

    Rank r sends ``2n - c_r - c_{r+1}`` and receives ``2n - c_{r-1} - c_r`` elements, i.e.
    2(P-1)/P n each way when P divides n. Every chunk is summed once, by the ring, and then
    copied, so all ranks end with bitwise identical results.
    """
    size, rank = view.size, view.rank
    n = buf.numel()
    if size <= 1 or n == 0:
        return
    b = chunk_bounds(n, size)
    seg = p2p.piece_elems(n, 2 * size, buf.element_size())
    if b[1] - b[0] > seg and not buf.is_cuda:
        _pipelined(buf, view, b, seg, op=op, timeout=timeout)
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    tmp = scratch(b[1] - b[0], buf.dtype, buf.device)

    def chunk(i: int) -> torch.Tensor:
        i %= size
        return buf[b[i]:b[i + 1]]

    for s in range(size - 1):
        out, into = chunk(rank - 1 - s), chunk(rank - 2 - s)
        incoming = tmp[:into.numel()]
        p2p.transfer([(RECV, incoming, left), (SEND, out, right)],
                     view=view, op=op, timeout=timeout)
        into.add_(incoming)
    for s in range(size - 1):
        p2p.transfer([(RECV, chunk(rank - 1 - s), left), (SEND, chunk(rank - s), right)],
                     view=view, op=op, timeout=timeout)


def _pipelined(buf: torch.Tensor, view: GroupView, b: list[int], seg: int, *, op: str,
               timeout: float) -> None:
    """The same ring, with every chunk cut into segments of ``seg`` elements.

    Both neighbours post the segments of a chunk in the same order, so they match in order.
    A segment's send for step s+1 is posted as soon as its step-s receive (and add) is
    done; all sends are waited for before the buffer they read can change.
    """
    size, rank = view.size, view.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    tmp = scratch(b[1] - b[0], buf.dtype, buf.device)
    kw = {"view": view, "op": op, "timeout": timeout}

    def segments(i: int) -> list[tuple[int, int]]:
        return p2p.segments(b[i % size], b[i % size + 1], seg)

    # reduce-scatter
    sends = [p2p.post(SEND, buf[a:z], right, **kw) for a, z in segments(rank - 1)]
    for s in range(size - 1):
        idx = rank - 2 - s
        base = b[idx % size]
        recvs = [(a, z, p2p.post(RECV, tmp[a - base:z - base], left, **kw))
                 for a, z in segments(idx)]
        for a, z, pending in recvs:
            pending.wait()
            buf[a:z].add_(tmp[a - base:z - base])
            if s < size - 2:
                sends.append(p2p.post(SEND, buf[a:z], right, **kw))
    for pending in sends:
        pending.wait()
    # all-gather
    sends = [p2p.post(SEND, buf[a:z], right, **kw) for a, z in segments(rank)]
    for s in range(size - 1):
        recvs = [(a, z, p2p.post(RECV, buf[a:z], left, **kw))
                 for a, z in segments(rank - 1 - s)]
        for a, z, pending in recvs:
            pending.wait()
            if s < size - 2:
                sends.append(p2p.post(SEND, buf[a:z], right, **kw))
    for pending in sends:
        pending.wait()
