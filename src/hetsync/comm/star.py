"""Star all-reduce: every rank sends to the group's first, which sums and sends the sum back.

A parameter server's synchronous sum held by one of the workers (no extra rank): the
reduce-then-broadcast of a binomial tree flattened to one level.
"""

from __future__ import annotations

import torch

from . import p2p
from .buffers import scratch
from .p2p import RECV, SEND
from .topology import GroupView


def star_all_reduce(buf: torch.Tensor, view: GroupView, *, op: str, timeout: float) -> None:
    """Sum the 1-D contiguous ``buf`` in place across ``view``'s group through its rank 0.

    1. Every rank but the root (group rank 0) sends its whole vector to the root, its receive
       of the sum posted beside the send (one deadline for both).
    2. The root receives the P − 1 vectors at once (into a thread's scratch buffer of
       (P − 1) n elements, kept for the next call), adds them to its own in group-rank order
       and sends that sum to each of them, so every rank holds the same bits.

    Two messages per non-root rank, whatever P, where the ring takes 2(P − 1) steps and
    recursive doubling log2 P: on a few cores shared by many processes, or for short
    vectors, each message's wake-ups cost more than its bytes (LeNet's 61,706 floats among
    four processes on two cores: 1.5-1.8 ms, against 5.7-5.8 ms for gloo's ring;
    `docs/comm-bench.md`). The root sends and receives (P − 1) n elements, so for long
    vectors on a real network the ring's 2(P − 1)/P n per rank wins.

    A dead rank is named by the root; the other ranks, waiting for the root's reply, fail
    when the root's connection closes or their timeout ends, naming the root.
    """
    n = buf.numel()
    if view.size <= 1 or n == 0:
        return
    if view.rank != 0:
        total = scratch(n, buf.dtype, buf.device)  # (not into buf: it is still being sent)
        p2p.transfer([(RECV, total, 0), (SEND, buf, 0)], view=view, op=op, timeout=timeout)
        buf.copy_(total)
        return
    parts = scratch((view.size - 1) * n, buf.dtype, buf.device).view(view.size - 1, n)
    p2p.transfer([(RECV, parts[i - 1], i) for i in range(1, view.size)], view=view, op=op,
                 timeout=timeout)
    for part in parts:
        buf.add_(part)
    p2p.transfer([(SEND, buf, i) for i in range(1, view.size)], view=view, op=op,
                 timeout=timeout)
