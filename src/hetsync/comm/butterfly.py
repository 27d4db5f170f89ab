"""Butterfly all-reduce (recursive doubling).

Reference: Thakur, Rabenseifner & Gropp 2005, section 4 (recursive doubling, the
latency-optimal all-reduce for short vectors).
"""

from __future__ import annotations

import torch

from . import p2p
from .buffers import scratch
from .fold import folded
from .topology import GroupView


def butterfly_all_reduce(buf: torch.Tensor, view: GroupView, *, op: str,
                         timeout: float) -> None:
    """Sum the 1-D contiguous ``buf`` in place across ``view``'s group by recursive doubling.

    1. Fold the group onto p' = largest power of two <= P (:func:`~hetsync.comm.fold.folded`).
    2. For k = 0 .. log2(p')-1: rank i exchanges its whole vector with rank i XOR 2^k and
       adds what it received (both partners compute x + y, which IEEE addition makes equal
       bitwise, so all ranks end identical).
    3. Unfold: extra ranks receive the result.

    Each rank in p' sends and receives log2(p') n elements (log2(P) n for powers of two);
    log2(p') steps against the ring's 2(P-1), so it wins for short vectors.
    """
    n = buf.numel()
    if view.size <= 1 or n == 0:
        return
    with folded(buf, view, op=op, timeout=timeout) as fold:
        if fold.inner is None:
            return
        tmp = scratch(n, buf.dtype, buf.device)
        seg = p2p.piece_elems(n, 4, buf.element_size())
        mask = 1
        while mask < fold.size:
            partner = fold.inner ^ mask
            p2p.reduce_exchange(buf, partner, buf, partner, tmp, seg, view=view, op=op,
                                timeout=timeout)
            mask <<= 1
