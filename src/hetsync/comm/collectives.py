"""``all_reduce``: one entry point over the all-reduce algorithms of hetsync.comm.

=================  ==================================================  =====================
algorithm          steps (P ranks, n elements)                          elements sent / rank
=================  ==================================================  =====================
``native``         ``torch.distributed.all_reduce`` (gloo/NCCL's own)   2(P-1)/P n (theory)
``ring``           reduce-scatter + all-gather around a ring, 2(P-1)    2n - c_r - c_{r+1}
``butterfly``      recursive doubling, log2 P whole-vector exchanges    log2(P) n
``binary-blocks``  Rabenseifner: recursive halving + doubling, 2 log2 P 2(P-1)/P n
``star``           send to group rank 0, which sums and replies         n (root: (P-1) n)
``ps``             push to the parameter server, which sums and replies n + header
=================  ==================================================  =====================

(Counts for P a power of two dividing n; see each algorithm's docstring for the general
case and the fold-in used for other P.)
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from . import meter
from .binary_blocks import binary_blocks_all_reduce
from .butterfly import butterfly_all_reduce
from .p2p import comm_error
from .ps import default_client
from .ring import ring_all_reduce
from .star import star_all_reduce
from .timeouts import resolve_timeout
from .topology import GroupView

ALGORITHMS = ("native", "ring", "butterfly", "binary-blocks", "star", "ps")

_P2P_ALGORITHMS = {
    "ring": ring_all_reduce,
    "butterfly": butterfly_all_reduce,
    "binary-blocks": binary_blocks_all_reduce,
    "star": star_all_reduce,
}


def _native(buf: torch.Tensor, view: GroupView, *, op: str, timeout: float) -> None:
    try:
        work = dist.all_reduce(buf, group=view.group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - rewrapped with context
        raise comm_error(exc, op=op, kind="all_reduce", peer=None, seconds=timeout) from exc
    sent, recv = meter.ring_bytes(buf.numel(), view.size, view.rank, buf.element_size())
    meter.add(op, sent, recv)


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring",
               group: dist.ProcessGroup | None = None,
               timeout: float | datetime.timedelta | None = None) -> torch.Tensor:
    """Sum ``tensor`` in place across ``group``, like ``torch.distributed.all_reduce``.

    Args:
        tensor: the local contribution, overwritten with the sum (any shape; a
            non-contiguous tensor is reduced through a contiguous copy). Empty: no-op.
        algorithm: one of :data:`ALGORITHMS`.
        group: process group (default: the world). Callers outside it return at once.
        timeout: seconds each wait may take; ``None``: the process-wide default
            (:func:`hetsync.comm.set_default_timeout`).

    Returns:
        ``tensor``.

    Raises:
        ValueError: unknown ``algorithm``, bad ``timeout``.
        RuntimeError: ``"ps"`` without a connected parameter-server client.
        CommTimeoutError: a peer stayed silent for ``timeout`` seconds.
        CommError: a peer's connection failed.

    Bytes are counted in :mod:`hetsync.comm.meter` under ``"all_reduce/<algorithm>"``.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; valid: "
                         f"{', '.join(ALGORITHMS)}")
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    seconds = resolve_timeout(timeout)
    op = f"all_reduce/{algorithm}"
    if algorithm == "ps":
        client = default_client()
        if client is None:
            raise RuntimeError(
                "all_reduce(algorithm='ps') needs a parameter-server client: call "
                "hetsync.comm.connect(server_rank) on every worker, and run "
                "hetsync.comm.ParameterServer(worker_ranks).serve() on the server rank")
        view = GroupView.of(group)
        if view.rank < 0:
            return tensor
        if tensor.numel() == 0:
            return tensor
        return client.sum(tensor, timeout=seconds, _op=op)
    view = GroupView.of(group)
    if view.rank < 0 or tensor.numel() == 0:
        return tensor
    if algorithm != "native" and view.size <= 1:
        return tensor
    fn = _native if algorithm == "native" else _P2P_ALGORITHMS[algorithm]
    with torch.no_grad():
        if tensor.is_contiguous():
            fn(tensor.view(-1), view, op=op, timeout=seconds)
        else:
            buf = tensor.contiguous().view(-1)
            fn(buf, view, op=op, timeout=seconds)
            tensor.copy_(buf.view(tensor.shape))
    return tensor

