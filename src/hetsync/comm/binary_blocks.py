"""Rabenseifner's all-reduce ("binary blocks"): recursive-halving reduce-scatter followed by a
recursive-doubling all-gather.

Reference: R. Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004;
Thakur, Rabenseifner & Gropp 2005, section 4.
"""

from __future__ import annotations

import torch

from . import p2p
from .buffers import scratch
from .fold import folded
from .p2p import RECV, SEND
from .topology import GroupView, chunk_bounds


def binary_blocks_all_reduce(buf: torch.Tensor, view: GroupView, *, op: str,
                             timeout: float) -> None:
    """Sum the 1-D contiguous ``buf`` in place across ``view``'s group (Rabenseifner).

    1. Fold the group onto p' = 2^L = largest power of two <= P
       (:func:`~hetsync.comm.fold.folded`); cut ``buf`` into p' nearly equal chunks.
    2. Reduce-scatter by recursive halving: for mask = p'/2, p'/4, .., 1 rank i pairs with
       i XOR mask; of the chunk range it holds, it keeps the lower half if bit ``mask`` of i
       is 0 (else the upper), sends the other half and adds the partner's copy of the kept
       half. After L steps rank i holds the full sum of chunk i.
    3. All-gather by recursive doubling: for mask = 1, 2, .., p'/2 rank i sends its block
       of ``mask`` chunks to i XOR mask and receives the partner's adjacent block in place.
    4. Unfold: extra ranks receive the result.

    Each rank in p' sends and receives ``sum_k |half kept at step k| + (n - c_i)`` elements:
    2(p'-1)/p' n when p' divides n, like the ring, in 2 log2(p') steps instead of 2(P-1).
    """
    n = buf.numel()
    if view.size <= 1 or n == 0:
        return
    with folded(buf, view, op=op, timeout=timeout) as fold:
        if fold.inner is None:
            return
        size, me = fold.size, fold.inner
        b = chunk_bounds(n, size)
        tmp = scratch(b[size // 2] if size > 1 else 0, buf.dtype, buf.device)
        lo, hi = 0, size
        mask = size >> 1
        while mask >= 1:
            partner = me ^ mask
            mid = (lo + hi) // 2
            (klo, khi), (glo, ghi) = ((mid, hi), (lo, mid)) if me & mask else \
                ((lo, mid), (mid, hi))
            keep = buf[b[klo]:b[khi]]
            incoming = tmp[:keep.numel()]
            p2p.transfer([(RECV, incoming, partner), (SEND, buf[b[glo]:b[ghi]], partner)],
                         view=view, op=op, timeout=timeout)
            keep.add_(incoming)
            lo, hi = klo, khi
            mask >>= 1
        mask = 1
        while mask < size:
            partner = me ^ mask
            plo, phi = (lo - mask, lo) if me & mask else (hi, hi + mask)
            p2p.transfer([(RECV, buf[b[plo]:b[phi]], partner), (SEND, buf[b[lo]:b[hi]], partner)],
                         view=view, op=op, timeout=timeout)
            lo, hi = min(lo, plo), max(hi, phi)
            mask <<= 1
