"""Timed, metered point-to-point transfers: the transport every hetsync collective uses.

A call posts all its receives and sends at once (``irecv`` before ``isend``), then waits for
each against one deadline, so that a pairwise exchange never deadlocks and a dead or silent
peer surfaces as a :class:`~hetsync.comm.errors.CommError` /
:class:`~hetsync.comm.errors.CommTimeoutError` naming the operation, the peer's global rank
and the seconds, instead of a hang. Each completed transfer adds its bytes to the
:mod:`~hetsync.comm.meter`.

Peers are given as *group* ranks of a :class:`~hetsync.comm.topology.GroupView`; CPU
transfers are posted one by one on the process group object itself
(``ProcessGroup.send/recv``, which take group ranks; the Python wrappers
``dist.isend/irecv`` cost about 30 us more per call), so a failure is attributed to its
peer, and errors name the peer's global rank. CUDA tensors are posted with
:func:`torch.distributed.batch_isend_irecv` (NCCL needs grouped point-to-point calls to
avoid deadlock).

Gloo closes the connection to a peer whose transfer timed out: after a
:class:`CommTimeoutError` the group must be considered broken.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Sequence

import torch
import torch.distributed as dist

from . import meter
from .errors import CommError, CommTimeoutError
from .topology import GroupView

#: Tag of collective traffic (gloo matches point-to-point messages by peer and tag).
TAG_COLLECTIVE = 0x4853
#: Smallest piece a long CPU transfer is cut into (see :func:`piece_elems`): pieces let
#: the reduction of one overlap the transfer of the next.
SEGMENT_BYTES = 1 << 20

SEND = "send"
RECV = "recv"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _is_timeout(exc: BaseException) -> bool:
    # gloo: "Timed out waiting 5000ms for recv operation to complete"; a later use of a pair
    # that an earlier timeout closed says "Application timeout caused pair closure": that
    # one is a failed connection, not a new timeout.
    text = str(exc).lower()
    return "timed out" in text or ("timeout" in text and "pair closure" not in text)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def comm_error(exc: BaseException, *, op: str, kind: str, peer: int | None,
               seconds: float) -> CommError:
    """``exc`` from torch.distributed as a CommTimeoutError or CommError naming op and peer."""
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
             tag: int = TAG_COLLECTIVE, room: int = 1) -> tuple[int, int]:
    """Post every ``(SEND|RECV, tensor, group_rank[, tag])`` in ``ops`` and wait for all.

    Receives are posted (and waited for) before sends, each kind in the order given;
    messages between two ranks on one tag match in order. Empty tensors are skipped (both
    ends skip them, as both know the sizes). Every wait shares one deadline ``timeout``
    seconds from now. ``tag`` is the default for entries without their own. ``room``: each
    receive's tensor has room for that many times the message it expects (a parameter
    server's, `wire.PAYLOAD_ROOM`); the message's bytes are counted, not the room's.

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
    if ordered[0][1].is_cuda:
        p2p = [dist.P2POp(dist.irecv if k == RECV else dist.isend, t, group=view.group,
                          group_peer=peer, tag=tg) for k, t, peer, tg in ordered]
        try:
            works = dist.batch_isend_irecv(p2p)
        except Exception as exc:  # noqa: BLE001 - rewrapped with context
            raise comm_error(exc, op=op, kind="exchange", peer=None,
                             seconds=timeout) from exc
        for w in works:
            try:
                w.wait(timeout=_remaining(deadline))
            except Exception as exc:  # noqa: BLE001
                peers = sorted({view.global_rank(o[2]) for o in ordered})
                err = comm_error(exc, op=op, kind="exchange", peer=None, seconds=timeout)
                err.args = (f"{err} (batch with ranks {peers})",)
                raise err from exc
        return _count(ordered, op, room)
    posted = [post(kind, t, peer, view=view, op=op, timeout=timeout, tag=tg)
              for kind, t, peer, tg in ordered]
    for p in posted:
        p.wait(deadline, meter_bytes=False)
    return _count(ordered, op, room)


class Pending:
    """One posted transfer; :meth:`wait` bounds it, wraps its errors and meters its bytes."""

    __slots__ = ("kind", "tensor", "peer", "work", "view", "op", "timeout")

    def __init__(self, kind, tensor, peer, work, view, op, timeout):
        self.kind, self.tensor, self.peer, self.work = kind, tensor, peer, work
        self.view, self.op, self.timeout = view, op, timeout

    def wait(self, deadline: float | None = None, *, meter_bytes: bool = True) -> None:
        """Wait until done or ``deadline`` (``time.monotonic()``; default: now + timeout)."""
        if self.work is None:
            return
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        try:
            self.work.wait(timeout=_remaining(deadline))
        except Exception as exc:  # noqa: BLE001
            raise comm_error(exc, op=self.op, kind=self.kind,
                             peer=self.view.global_rank(self.peer),
                             seconds=self.timeout) from exc
        self.work = None
        if meter_bytes:
            n = _nbytes(self.tensor)
            meter.add(self.op, n if self.kind == SEND else 0, n if self.kind == RECV else 0)


def post(kind: str, tensor: torch.Tensor, peer: int, *, view: GroupView, op: str,
         timeout: float, tag: int = TAG_COLLECTIVE) -> Pending:
    """Post one ``SEND``/``RECV`` of ``tensor`` with group rank ``peer`` (no wait).

    For pipelines on CPU tensors: messages between two ranks on one tag match in posting
    order, so both ends must post their pieces in the same order. An empty tensor posts
    nothing.
    """
    if tensor.numel() == 0:
        return Pending(kind, tensor, peer, None, view, op, timeout)
    try:   # the process group's own send/recv (group ranks): no per-call Python checks
        if kind == RECV:
            work = view.pg.recv([tensor], peer, tag)
        else:
            work = view.pg.send([tensor], peer, tag)
    except Exception as exc:  # noqa: BLE001
        raise comm_error(exc, op=op, kind=kind, peer=view.global_rank(peer),
                         seconds=timeout) from exc
    return Pending(kind, tensor, peer, work, view, op, timeout)


def _count(ops: Sequence[tuple], op: str, room: int = 1) -> tuple[int, int]:
    sent = sum(_nbytes(o[1]) for o in ops if o[0] == SEND)
    recv = sum(_nbytes(o[1]) for o in ops if o[0] == RECV) // room
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


class Inbox:
    """The next message on ``tag`` from each of ``peers`` (group ranks), as they arrive.

    A server's "from whichever client sends first". gloo's any-source receive cannot be it
    where clients may die: a sender that dies after announcing a message the receiver has
    not asked for yet leaves the announcement behind, and every later any-source receive on
    that tag fails, naming nobody (gloo as in torch 2.x). Here each peer has a receive of its
    own, waited on by a thread of its own: a death fails that peer's receive only and names
    it, whether it died idle or in the middle of its message.

    1. :meth:`ask` posts the next receive from a peer (one outstanding per peer).
    2. :meth:`get` returns ``(peer, tensor)`` for the first receive that completed, or raises
       :class:`CommError` naming the peer whose receive failed (its connection closed), or
       :class:`CommTimeoutError` when none completed in time. A peer is asked again only
       when the caller wants its next message.
    3. :meth:`relink`: a peer's messages come on another group from now (a lost peer's new
       process, on a group of its own with the receiver); what its old receive reports is
       dropped.
    4. :meth:`close`: threads still waiting (on peers that stay silent) are left to
       :func:`stranded`.

    Peers are named by their rank in ``view`` (their global rank, where ``view`` is the
    world's) however they are linked.
    """

    #: a thread waits until its peer sends or its connection fails; silence is the caller's
    #: to judge (`get`'s timeout), not the receive's
    _FOREVER = datetime.timedelta(days=365)

    def __init__(self, peers: Sequence[int], *, numel: int, dtype: torch.dtype,
                 view: GroupView, op: str, tag: int, fill: int | float | None = None):
        self._op, self._tag = op, tag
        #: each receive's room, and what it holds until a message lands (None: nothing set)
        self._numel, self._dtype, self._fill = numel, dtype, fill
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()
        #: peer -> (view, its rank there, its receives' queue): the link its messages come on
        self._links: dict[int, tuple[GroupView, int, queue.SimpleQueue]] = {}
        self.asked: set[int] = set()
        self._threads: list[threading.Thread] = []
        for p in peers:
            self.relink(p, view, p)

    def relink(self, peer: int, view: GroupView, group_rank: int) -> None:
        """Receive ``peer``'s messages from ``group_rank`` of ``view`` from now on."""
        if peer in self._links:
            self._links[peer][2].put(None)  # (its thread ends, or reports a dropped failure)
        posted: queue.SimpleQueue = queue.SimpleQueue()
        self._links[peer] = (view, group_rank, posted)
        self.asked.discard(peer)
        thread = threading.Thread(target=self._wait, args=(peer, posted), daemon=True,
                                  name=f"hetsync-inbox-{peer}")
        self._threads.append(thread)
        thread.start()

    def ask(self, peer: int) -> None:
        """Post the receive of ``peer``'s next message."""
        view, group_rank, posted = self._links[peer]
        tensor = (torch.empty(self._numel, dtype=self._dtype) if self._fill is None else
                  torch.full((self._numel,), self._fill, dtype=self._dtype))
        self.asked.add(peer)
        try:  # fails at once where the connection is already closed
            work = view.pg.recv([tensor], group_rank, self._tag)
        except Exception as exc:  # noqa: BLE001
            self._arrived.put((peer, posted, None, exc))
            return
        posted.put((tensor, work))

    def _wait(self, peer: int, posted: queue.SimpleQueue) -> None:
        while (item := posted.get()) is not None:
            tensor, work = item
            try:
                work.wait(timeout=self._FOREVER)
            except Exception as exc:  # noqa: BLE001 - reported to get()
                self._arrived.put((peer, posted, None, exc))
                return
            self._arrived.put((peer, posted, tensor, None))

    def get(self, timeout: float) -> tuple[int, torch.Tensor]:
        """The first asked message to arrive within ``timeout`` seconds: (peer, tensor)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                peer, posted, tensor, exc = self._arrived.get(
                    timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise CommTimeoutError(f"{self._op}: no message from any of "
                                       f"{sorted(self.asked)} within {timeout:g} s",
                                       op=self._op, seconds=timeout) from None
            if posted is self._links[peer][2]:
                break  # (else from a link replaced since: dropped)
        self.asked.discard(peer)
        if exc is not None:
            view, group_rank, _ = self._links[peer]
            raise comm_error(exc, op=self._op, kind=RECV, peer=view.global_rank(group_rank),
                             seconds=timeout) from exc
        return peer, tensor

    def close(self) -> None:
        """Stop the threads; those still waiting on a silent peer are left behind."""
        for _, _, posted in self._links.values():
            posted.put(None)
        _left.extend(t for t in self._threads if t.is_alive())


#: threads that may still be blocked in a transfer of a group (see `stranded`)
_left: list[threading.Thread] = []


def leave_behind(thread: threading.Thread) -> None:
    """Note a thread that may stay blocked in a transfer after its owner is done."""
    _left.append(thread)


def stranded() -> list[threading.Thread]:
    """Threads left blocked in a transfer: a closed channel's job after a regroup, an
    :class:`Inbox`'s wait on a silent peer. A process must not shut the interpreter down
    under such a daemon thread (when the transfer ends, taking the GIL back inside torch's
    C++ at shutdown ends in std::terminate, exit code -6): `python -m hetsync` then leaves
    with os._exit, its files closed."""
    return [t for t in _left if t.is_alive()]


def wait_released(tensors: Sequence[torch.Tensor], within: float = 5.0) -> bool:
    """Wait until torch's process-group threads hold none of `tensors` (the caller's
    reference is each one's only one; a work's handle left with the caller holds it too),
    at most `within` seconds; whether they did.

    A gloo (or NCCL) work keeps its tensors until the thread that ran it drops the work,
    a moment after ``wait()`` returned. A tensor the caller lets go first is then freed on
    that thread, which must take the GIL to do it; if the interpreter is shutting down by
    then (a process's last collective, just before it exits), the thread exits inside
    torch's C++ instead and the process aborts (std::terminate, exit code -6). So the
    tensors of a process's last collectives are held until the threads let go (torch's
    ``Tensor._use_count``: the holders of the tensor's C++ object).
    """
    deadline = time.monotonic() + within
    while any(t._use_count() > 1 for t in tensors):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def piece_elems(numel: int, parts: int, element_size: int) -> int:
    """Elements per piece when ``numel`` elements are pipelined in about ``parts`` pieces.

    ``ceil(numel / parts)``, but never below :data:`SEGMENT_BYTES`. Like gloo's own ring
    (two segments per chunk), few large pieces: each piece costs a post, a wake-up and a
    lock round trip with gloo's I/O thread, which on an oversubscribed CPU costs more than
    the overlap gains. Every rank computes the same value from the same arguments.
    """
    return max(1, SEGMENT_BYTES // element_size, -(-numel // max(1, parts)))


def segments(lo: int, hi: int, seg: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into consecutive pieces of ``seg`` elements (the last shorter)."""
    return [(a, min(a + seg, hi)) for a in range(lo, hi, seg)]


def send_pieces(tensor: torch.Tensor, dst: int, seg: int, *, view: GroupView, op: str,
                timeout: float) -> None:
    """Send ``tensor`` to ``dst`` cut as :func:`reduce_exchange` with the same ``seg`` cuts
    what it receives."""
    reduce_exchange(tensor, dst, tensor[:0], dst, tensor[:0], seg, view=view, op=op,
                    timeout=timeout)


def reduce_exchange(send_tensor: torch.Tensor, dst: int, into: torch.Tensor, src: int,
                    tmp: torch.Tensor, seg: int, *, view: GroupView, op: str,
                    timeout: float) -> None:
    """Send ``send_tensor`` to ``dst`` while adding ``src``'s vector into ``into``.

    ``tmp`` (at least ``into.numel()`` elements) receives ``src``'s data. On CPU, both
    directions travel in pieces of ``seg`` elements (:func:`piece_elems`), all posted at
    once, and each received piece is added as soon as it lands, while the rest are still on
    the wire. Both ends must pass the same ``seg`` so that pieces match in order. ``send_tensor`` may be
    ``into`` itself (butterfly): a piece is then added only once its own send is done.
    """
    n = into.numel()
    incoming = tmp[:n]
    if into.is_cuda or (n <= seg and send_tensor.numel() <= seg):   # one piece each way
        transfer([(RECV, incoming, src), (SEND, send_tensor, dst)], view=view, op=op,
                 timeout=timeout)
        into.add_(incoming)
        return
    kw = {"view": view, "op": op, "timeout": timeout}
    recvs = [(a, z, post(RECV, incoming[a:z], src, **kw)) for a, z in segments(0, n, seg)]
    sends = [post(SEND, send_tensor[a:z], dst, **kw)
             for a, z in segments(0, send_tensor.numel(), seg)]
    aliased = send_tensor.data_ptr() == into.data_ptr() and send_tensor.numel() == n
    for j, (a, z, pending) in enumerate(recvs):
        pending.wait()
        if aliased:
            sends[j].wait()
        into[a:z].add_(incoming[a:z])
    for pending in sends:
        pending.wait()
