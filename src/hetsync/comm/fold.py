"""The fold-in that lets power-of-two algorithms run on any group size.

Reference: Thakur, Rabenseifner & Gropp 2005, section 4.1 (non-power-of-two processes).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from . import p2p
from .buffers import scratch
from .topology import Fold, GroupView


@contextlib.contextmanager
def folded(buf: torch.Tensor, view: GroupView, *, op: str, timeout: float) -> Iterator[Fold]:
    """Fold ``view``'s P ranks onto p' = largest power of two <= P around the body.

    1. Each of the r = P - p' extra ranks p'+i sends its whole ``buf`` to rank i, which adds
       it to its own.
    2. The body runs the power-of-two algorithm on ranks 0..p'-1 (``fold.inner`` is the
       caller's rank there; ``None`` for an extra rank, which must do nothing).
    3. Rank i sends the result to its extra rank p'+i, which receives it into ``buf``.

    Costs the partner and the extra n elements each way on top of the body.
    """
    fold = Fold.of(view.rank, view.size)
    seg = p2p.piece_elems(buf.numel(), 4, buf.element_size())
    if fold.inner is None:
        p2p.send_pieces(buf, fold.partner, seg, view=view, op=op, timeout=timeout)
    elif fold.partner is not None:
        tmp = scratch(buf.numel(), buf.dtype, buf.device)
        p2p.reduce_exchange(buf[:0], fold.partner, buf, fold.partner, tmp, seg, view=view,
                            op=op, timeout=timeout)
    yield fold
    if fold.inner is None:
        p2p.recv(buf, fold.partner, view=view, op=op, timeout=timeout)
    elif fold.partner is not None:
        p2p.send(buf, fold.partner, view=view, op=op, timeout=timeout)
