"""Timed, metered point-to-point transfers: the transport every hetsync collective uses.

A call posts all its receives and sends at once (``irecv`` before ``isend``), then waits for
each against one deadline, so that a pairwise exchange never deadlocks and a dead or silent
peer surfaces as a :class:`~hetsync.comm.errors.CommError` /
:class:`~hetsync.comm.errors.CommTimeoutError` naming the operation, the peer's global rank
and the seconds, instead of a hang. Each completed transfer adds its bytes to the
:mod:`~hetsync.comm.meter`.

Peers are given as *group* ranks of a :class:`~hetsync.comm.topology.GroupView`; torch maps
them (``group_dst``/``group_src``) and errors name the global rank. CUDA tensors are posted
with :func:`torch.distributed.batch_isend_irecv` (NCCL needs grouped point-to-point calls to
avoid deadlock); CPU tensors one by one, so a failure is attributed to its peer.

Gloo closes the connection to a peer whose transfer timed out: after a
:class:`CommTimeoutError` the group must be considered broken.
"""

from __future__ import annotations

import datetime
import time
from typing import Sequence

import torch
import torch.distributed as dist

from . import meter
from .errors import CommError, CommTimeoutError
from .topology import GroupView

#: Tag of collective traffic (gloo matches point-to-point messages by peer and tag).
TAG_COLLECTIVE = 0x4853

SEND = "send"
RECV = "recv"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text and "pair closure" not in text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _error(exc: BaseException, *, op: str, kind: str, peer: int | None, seconds: float,
           ) -> CommError:
    who = f"rank {peer}" if peer is not None else "any rank"
    direction = {SEND: "to", RECV: "from"}.get(kind, "with")
    if _is_timeout(exc):
        return CommTimeoutError(
            f"{op}: {kind} {direction} {who} did not complete within {seconds:g} s "
            f"(peer dead or silent?)", op=op, peer=peer, seconds=seconds)
    return CommError(f"{op}: {kind} {direction} {who} failed: {_first_line(exc)}",
                     op=op, peer=peer)


def _remaining(deadline: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(deadline - time.monotonic(), 1e-3))


def transfer(ops: Sequence[tuple], *, view: GroupView, op: str, timeout: float,
             tag: int = TAG_COLLECTIVE) -> tuple[int, int]:
    """Post every ``(SEND|RECV, tensor, group_rank[, tag])`` in ``ops`` and wait for all.

    Receives are posted (and waited for) before sends, each kind in the order given;
    messages between two ranks on one tag match in order. Empty tensors are skipped (both
    ends skip them, as both know the sizes). Every wait shares one deadline ``timeout``
    seconds from now. ``tag`` is the default for entries without their own.

    Returns (bytes sent, bytes received), as added to the meter.

    Raises:
        CommTimeoutError: a transfer did not complete in time (names op, peer, seconds).
        CommError: a transfer failed (e.g. the peer's connection dropped).
    """
    ops = [(o[0], o[1], o[2], o[3] if len(o) > 3 else tag) for o in ops if o[1].numel() > 0]
    if not ops:
        return 0, 0
    ordered = [o for o in ops if o[0] == RECV] + [o for o in ops if o[0] == SEND]
    deadline = time.monotonic() + timeout
    posted: list[tuple[str, torch.Tensor, int, object]] = []
    if ordered[0][1].is_cuda:
        p2p = [dist.P2POp(dist.irecv if k == RECV else dist.isend, t, group=view.group,
                          group_peer=peer, tag=tg) for k, t, peer, tg in ordered]
        try:
            works = dist.batch_isend_irecv(p2p)
        except Exception as exc:  # noqa: BLE001 - rewrapped with context
            raise _error(exc, op=op, kind="exchange", peer=None, seconds=timeout) from exc
        for w in works:
            try:
                w.wait(timeout=_remaining(deadline))
            except Exception as exc:  # noqa: BLE001
                peers = sorted({view.global_rank(o[2]) for o in ordered})
                err = _error(exc, op=op, kind="exchange", peer=None, seconds=timeout)
                err.args = (f"{err} (batch with ranks {peers})",)
                raise err from exc
        return _count(ordered, op)
    for kind, t, peer, tg in ordered:
        fn = dist.irecv if kind == RECV else dist.isend
        try:
            work = fn(t, group=view.group, tag=tg,
                      **({"group_src": peer} if kind == RECV else {"group_dst": peer}))
        except Exception as exc:  # noqa: BLE001
            raise _error(exc, op=op, kind=kind, peer=view.global_rank(peer),
                         seconds=timeout) from exc
        posted.append((kind, t, peer, work))
    for kind, t, peer, work in posted:
        try:
            work.wait(timeout=_remaining(deadline))
        except Exception as exc:  # noqa: BLE001
            raise _error(exc, op=op, kind=kind, peer=view.global_rank(peer),
                         seconds=timeout) from exc
    return _count(ordered, op)


def _count(ops: Sequence[tuple], op: str) -> tuple[int, int]:
    sent = sum(_nbytes(o[1]) for o in ops if o[0] == SEND)
    recv = sum(_nbytes(o[1]) for o in ops if o[0] == RECV)
    meter.add(op, sent, recv)
    return sent, recv


def send(tensor: torch.Tensor, dst: int, *, view: GroupView, op: str, timeout: float,
         tag: int = TAG_COLLECTIVE) -> None:
    """Send ``tensor`` to group rank ``dst`` and wait (see :func:`transfer`)."""
    transfer([(SEND, tensor, dst)], view=view, op=op, timeout=timeout, tag=tag)


def recv(tensor: torch.Tensor, src: int, *, view: GroupView, op: str, timeout: float,
         tag: int = TAG_COLLECTIVE) -> None:
    """Receive into ``tensor`` from group rank ``src`` and wait (see :func:`transfer`)."""
    transfer([(RECV, tensor, src)], view=view, op=op, timeout=timeout, tag=tag)


def exchange(send_tensor: torch.Tensor | None, dst: int | None,
             recv_tensor: torch.Tensor | None, src: int | None, *, view: GroupView, op: str,
             timeout: float, tag: int = TAG_COLLECTIVE) -> None:
    """Send ``send_tensor`` to ``dst`` while receiving ``recv_tensor`` from ``src``.

    Either side may be ``None`` (or empty) to skip it.
    """
    ops = []
    if recv_tensor is not None:
        ops.append((RECV, recv_tensor, src))
    if send_tensor is not None:
        ops.append((SEND, send_tensor, dst))
    transfer(ops, view=view, op=op, timeout=timeout, tag=tag)


def recv_any(tensor: torch.Tensor, *, view: GroupView, op: str, timeout: float,
             tag: int, count: bool = True) -> int:
    """Receive into ``tensor`` from whichever rank sends first on ``tag``; return its group rank.

    Needs a backend with any-source receive (gloo, MPI; not NCCL). With ``count=False`` the
    bytes are not metered (the caller meters them once it knows the operation).
    """
    try:
        work = dist.irecv(tensor, group=view.group, tag=tag)
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001
        raise _error(exc, op=op, kind=RECV, peer=None, seconds=timeout) from exc
    src = work._source_rank()
    if count:
        meter.add(op, 0, _nbytes(tensor))
    return src
