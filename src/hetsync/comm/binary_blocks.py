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

    On CPU the steps are pipelined (:func:`_pipelined`): every receive is posted up front and
    each piece (about half a chunk, :func:`~hetsync.comm.p2p.piece_elems`) is forwarded to
    the next partner as soon as it is final, so the steps overlap instead of waiting for
    one another.

    Each rank in p' sends and receives ``sum_k |half kept at step k| + (n - c_i)`` elements:
    2(p'-1)/p' n when p' divides n, like the ring, in 2 log2(p') steps instead of 2(P-1).
    """
    n = buf.numel()
    if view.size <= 1 or n == 0:
        return
    with folded(buf, view, op=op, timeout=timeout) as fold:
        if fold.inner is None:
            return
        if buf.is_cuda:
            _stepwise(buf, view, fold.size, fold.inner, op=op, timeout=timeout)
        else:
            _pipelined(buf, view, fold.size, fold.inner, op=op, timeout=timeout)


def _stepwise(buf: torch.Tensor, view: GroupView, size: int, me: int, *, op: str,
              timeout: float) -> None:
    """Steps 2 and 3, one whole exchange per step (used for CUDA tensors)."""
    b = chunk_bounds(buf.numel(), size)
    tmp = scratch(b[size // 2] if size > 1 else 0, buf.dtype, buf.device)
    seg = p2p.piece_elems(buf.numel(), 2 * size, buf.element_size())
    lo, hi = 0, size
    mask = size >> 1
    while mask >= 1:
        partner = me ^ mask
        mid = (lo + hi) // 2
        (klo, khi), (glo, ghi) = ((mid, hi), (lo, mid)) if me & mask else ((lo, mid), (mid, hi))
        p2p.reduce_exchange(buf[b[glo]:b[ghi]], partner, buf[b[klo]:b[khi]], partner, tmp,
                            seg, view=view, op=op, timeout=timeout)
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


def _pipelined(buf: torch.Tensor, view: GroupView, size: int, me: int, *, op: str,
               timeout: float) -> None:
    """Steps 2 and 3 with every transfer cut into segments and the steps overlapped.

    Partners must post the pieces of a range in the same order; both derive it from bits
    they share (partners differ only in the bit of their step):

    - reduce-scatter: a range received at step j is ordered as [the half the receiver
      gives at step j+1 (recursively ordered), the half it keeps]; so the pieces it must
      forward at step j+1 are final first, in the order the next partner expects them.
    - all-gather: a block is ordered as [its owner's own half, the other half]
      (recursively), which is the order in which the owner has the pieces.
    """
    kw = {"view": view, "op": op, "timeout": timeout}
    b = chunk_bounds(buf.numel(), size)
    seg = p2p.piece_elems(buf.numel(), 2 * size, buf.element_size())
    steps = size.bit_length() - 1
    masks = [size >> (j + 1) for j in range(steps)]

    def pieces(lo: int, hi: int) -> list[tuple[int, int]]:
        return p2p.segments(b[lo], b[hi], seg)

    def halves(lo: int, hi: int, j: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(give, keep) halves of [lo, hi) at halving step j, for ranks sharing me's bit."""
        mid = (lo + hi) // 2
        return ((lo, mid), (mid, hi)) if me & masks[j] else ((mid, hi), (lo, mid))

    def rs_order(lo: int, hi: int, j: int) -> list[tuple[int, int]]:
        if j + 1 >= steps or hi - lo <= 1:
            return pieces(lo, hi)
        give, keep = halves(lo, hi, j + 1)
        return rs_order(*give, j + 1) + pieces(*keep)

    # reduce-scatter: ranges of every step, receives all posted up front into tmp regions
    ranges, lo, hi = [], 0, size
    for j in range(steps):
        give, keep = halves(lo, hi, j)
        ranges.append((give, keep))
        lo, hi = keep
    tmp = scratch(sum(b[k[1]] - b[k[0]] for _, k in ranges), buf.dtype, buf.device)
    recvs, offset = [], 0
    for j, (_, (klo, khi)) in enumerate(ranges):
        shift = offset - b[klo]
        recvs.append([(a, z, shift, p2p.post(RECV, tmp[a + shift:z + shift], me ^ masks[j],
                                             **kw)) for a, z in rs_order(klo, khi, j)])
        offset += b[khi] - b[klo]
    sends = [p2p.post(SEND, buf[a:z], me ^ masks[0], **kw) for a, z in rs_order(*ranges[0][0], 0)]
    for j in range(steps):
        forward = len(rs_order(*ranges[j + 1][0], j + 1)) if j + 1 < steps else 0
        for count, (a, z, shift, pending) in enumerate(recvs[j]):
            pending.wait()
            buf[a:z].add_(tmp[a + shift:z + shift])
            if count < forward:
                sends.append(p2p.post(SEND, buf[a:z], me ^ masks[j + 1], **kw))
    for pending in sends:
        pending.wait()

    # all-gather: block of 2^k chunks holding chunk `owner`, ordered owner's half first
    def ag_order(lo: int, hi: int, owner: int) -> list[tuple[int, int]]:
        if hi - lo <= 1:
            return pieces(lo, hi)
        half = (hi - lo) // 2
        if owner - lo < half:
            return ag_order(lo, lo + half, owner) + ag_order(lo + half, hi, owner ^ half)
        return ag_order(lo + half, hi, owner) + ag_order(lo, lo + half, owner ^ half)

    partners = [me ^ (1 << k) for k in range(steps)]
    incoming = []
    for k, q in enumerate(partners):
        m = 1 << k
        base = q - q % m
        incoming.append([(a, z, p2p.post(RECV, buf[a:z], q, **kw))
                         for a, z in ag_order(base, base + m, q)])
    sends = [p2p.post(SEND, buf[a:z], q, **kw) for q in partners for a, z in pieces(me, me + 1)]
    for k in range(steps):
        for a, z, pending in incoming[k]:
            pending.wait()
            sends.extend(p2p.post(SEND, buf[a:z], q, **kw) for q in partners[k + 1:])
    for pending in sends:
        pending.wait()
