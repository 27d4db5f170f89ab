"""Parameter server: one extra rank that sums synchronously or applies updates asynchronously.

By convention the server is the last global rank; the workers are the others. The server
runs :meth:`ParameterServer.serve` until every worker has said goodbye; each worker talks to
it through a :class:`PSClient` (or the module-level one from :func:`connect`). Messages use
the fixed header of :mod:`hetsync.comm.wire`; all traffic goes through the default process
group with a backend that can receive from any source (gloo or MPI; not NCCL). Payloads
travel as flat CPU tensors.

Three uses:

- **synchronous sum** (:meth:`PSClient.sum`, ``all_reduce(t, "ps")``): every worker pushes
  its k-th SUM (header field ``round`` = k); once all workers' pushes for round k are in,
  the server adds them in worker-rank order and replies the sum to each.
- **asynchronous apply-and-serve** (:meth:`PSClient.push_pull`, :meth:`PSClient.pull`): the
  server hands the update at once to its :class:`ServerRule` and replies with what the rule
  returns. Requests are served one at a time, in arrival order, whichever worker sent
  them, so a fast worker never waits for a slow one.
- **sparse messages**: any push or reply may be a :class:`~hetsync.comm.wire.SparseMessage`
  (int32 indices, values, dense length in the header).
- **on a virtual clock** (``link=``, :mod:`hetsync.clock`): every request carries its
  sender's virtual time; the server serves the one that reaches it first on the virtual
  clock (ties by rank) once no other open worker can still send an earlier one (a worker
  sends nothing before its last reply reached it), so the order of pushes (staleness, a
  buffer's contents) is the virtual clock's, not the real machine's; each reply carries when
  it reaches its worker, after the server's own work on the requests before it
  (``work_s_per_byte``; 0: free). A sum's parts are taken as they come (the workers' clocks
  meet after it, at the price ``hetsync.clock.network`` gives ``ps``).

Example (3 ranks: workers 0, 1; server 2)::

    if rank == 2:
        ParameterServer([0, 1], rule=MyRule()).serve()
    else:
        with PSClient(server_rank=2) as ps:
            weights = ps.push_pull(update)
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Callable, Iterable, Protocol, runtime_checkable

import torch

from . import meter, p2p
from .errors import CommError, CommTimeoutError, ProtocolError
from .p2p import RECV, SEND
from .timeouts import resolve_timeout
from .topology import GroupView
from .wire import (DTYPE_CODES, HEADER_BYTES, HEADER_FILL, HEADER_LEN, HEADER_ROOM,
                   MAGIC_VERSION, MAX_RATE, PAYLOAD_ROOM, REQUESTS, Field, Header, Kind, Op,
                   Payload, SparseMessage, Status, checksum, decode, describe, overran,
                   payload_tensors, receive_buffers, received_fields, verify)

TAG_REQUEST = 0x4854
TAG_REQUEST_PAYLOAD = 0x4855
TAG_REPLY = 0x4856
TAG_REPLY_PAYLOAD = 0x4857

#: Meter operation names of the requests (the same on worker and server).
OP_NAMES = {Op.PULL: "ps/pull", Op.PUSH_PULL: "ps/push_pull", Op.SUM: "ps/sum",
            Op.BYE: "ps/bye"}


@runtime_checkable
class ServerRule(Protocol):
    """What the server does with asynchronous requests (ASGD, DC-ASGD, DGS, ...).

    ``worker`` is the requesting worker's global rank. Both methods run on the server's
    single thread, one request at a time, and should be short. They may return a dense
    tensor (sent flat), a :class:`SparseMessage`, or ``None`` (an empty reply).
    """

    def pull(self, worker: int) -> torch.Tensor | SparseMessage:
        """The reply to a PULL: typically the current weights."""
        ...

    def push(self, worker: int, update: torch.Tensor | SparseMessage
             ) -> torch.Tensor | SparseMessage:
        """Apply ``update`` (a flat tensor or sparse message); return the reply."""
        ...


@dataclasses.dataclass
class ServerStats:
    """What a :class:`ParameterServer` has served so far."""

    requests: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"pull": 0, "push_pull": 0, "sum": 0, "bye": 0})
    per_worker: dict[int, int] = dataclasses.field(default_factory=dict)
    sum_rounds: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    #: requests refused, one dict per refused (and then dropped) worker: rank, field, error
    refused: list[dict] = dataclasses.field(default_factory=list)
    #: workers that never said BYE: given up after `linger`, or whose connection failed in
    #: the middle of a request (they died)
    lost: list[int] = dataclasses.field(default_factory=list)
    #: lost workers served again, each time one's new process linked (`joins`)
    rejoined: list[int] = dataclasses.field(default_factory=list)
    #: real seconds spent receiving and serving requests (their payloads, the rule, the
    #: replies handed to the transport): the server's own work, which a virtual clock's
    #: `work_s_per_byte` models
    busy_s: float = 0.0


def _explain(reply: Header) -> str:
    if reply.status == Status.BAD_HEADER:
        try:
            field = Field(reply.detail).name.lower()
        except ValueError:
            field = f"#{reply.detail}"
        return f"it did not understand header field '{field}'"
    if reply.status == Status.BAD_PAYLOAD:
        return "its payload was non-finite or did not match its header"
    if reply.status == Status.RULE_FAILED:
        return "its rule failed on the request (the server's log names the error)"
    if reply.status == Status.ROUND_ABORTED:
        return f"sum round {reply.detail} was aborted because a worker closed before pushing"
    return f"status {reply.status}"


class ParameterServer:
    """Serve PS requests from ``worker_ranks`` (global ranks) until all of them said goodbye.

    Args:
        worker_ranks: the workers' global ranks (the server's own rank excluded).
        rule: a :class:`ServerRule` for PULL and PUSH_PULL; may be ``None`` when only
            synchronous sums are served.
        timeout: seconds the server waits for any single transfer, including the wait for
            the next request from any worker; ``None``: the process-wide default.
        numel: the model's length: every push must have it; ``None``: any length up to
            :data:`~hetsync.comm.wire.MAX_NUMEL`.
        sum_numel: the longest sum (the model with its BatchNorm statistics; default
            ``numel``).
        linger: once a worker has said BYE (the run is over), how long the others may stay
            silent before they are taken for lost (a worker that died never says BYE) and the
            server returns, naming them in ``stats.lost``; ``None``: wait ``timeout``, then
            raise.
        known_lost: the workers someone outside knows are dead (``launch`` marks them in the
            store); asked after each goodbye, so the server need not linger for them.
        gone: called with each worker the server serves no more without its goodbye (lost
            or refused), so that the others need not wait for it (``hetsync.wrap``'s stop).
        joins: ``joins(lost)`` → ``[(worker, view)]``: the lost workers whose new process
            asked to be served again, each with the group of it and the server to serve it
            on from now (``runtime/server_link.py``); asked every :data:`JOIN_POLL_S` s at
            most, until a worker has said goodbye (the server waits for one up to the
            timeout once all are lost).

    The loop, one request at a time:

    1. Receive the next header from whichever open worker sends first (each has a receive
       of its own, :class:`~hetsync.comm.p2p.Inbox`, with room for
       :data:`~hetsync.comm.wire.HEADER_ROOM` fields); refuse one it does not understand,
       one out of sequence, with fewer or more fields than the wire's, or announcing a
       payload that is not the model's length (before anything is allocated for it).
    2. Receive the payload whose kind, dtype and sizes the header gave (into a buffer of
       NaN with room for :data:`~hetsync.comm.wire.PAYLOAD_ROOM` times them); refuse one
       longer than announced, with non-finite values (which a payload shorter than its
       header leaves), sparse indices out of range, or bytes that do not match the CRC-32
       its header carries (wire field 12).
       A refused worker -- and one whose request the rule fails on -- is told why (an ERROR
       reply), recorded in ``stats.refused`` and served no more, as if it had said BYE; the
       payload a refused header announced is received and dropped where its sizes are within
       bounds (so its sender reads the refusal); the others go on. A worker whose connection
       closes (it died: idle, in the middle of its header, of its payload or before its
       reply) is lost at once: recorded in ``stats.lost`` and served no more; the others go
       on. One that is silent without a closed connection (stopped, or its machine gone
       from the network) is given up ``linger`` seconds after the others have finished.
       A lost worker whose new process asks (``joins``) is served again, on its new link,
       its requests numbered afresh; so is an ``absent`` one (a spare that had not started).
    3. PULL / PUSH_PULL: reply with ``rule.pull(w)`` (with its CRC-32) / ``rule.push(w,
       update)`` at once.
       SUM: file the push under its round; when all workers' pushes for the round are in,
       add them in worker-rank order and reply the sum to every worker.
       BYE: acknowledge, and abort (reply ERROR to the waiting) any sum round that worker
       will now never join.
    """

    def __init__(self, worker_ranks: Iterable[int], rule: ServerRule | None = None,
                 timeout: float | None = None, numel: int | None = None,
                 sum_numel: int | None = None, linger: float | None = None,
                 known_lost: Callable[[], Iterable[int]] | None = None,
                 gone: Callable[[int, str], None] | None = None,
                 joins: Callable[[list[int]], list[tuple[int, GroupView]]] | None = None,
                 absent: Iterable[int] = (), link=None, work_s_per_byte: float = 0.0):
        workers = list(worker_ranks)
        if not workers:
            raise ValueError("worker_ranks must name at least one worker, got []")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in workers):
            raise ValueError(f"worker_ranks must be non-negative ints, got {workers}")
        if len(set(workers)) != len(workers):
            raise ValueError(f"worker_ranks has duplicates: {workers}")
        if rule is not None and not isinstance(rule, ServerRule):
            raise ValueError(f"rule must have pull(worker) and push(worker, update), got "
                             f"{type(rule).__name__}")
        for name, value in (("numel", numel), ("sum_numel", sum_numel)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not 0 <= work_s_per_byte < float("inf"):
            raise ValueError(f"work_s_per_byte must be a finite number >= 0, got "
                             f"{work_s_per_byte!r}")
        if linger is not None and not 0 < linger < float("inf"):
            raise ValueError(f"linger must be a finite number of seconds > 0, got {linger!r}")
        self.workers = tuple(sorted(workers))
        #: workers not started yet (spares): served once they link (`joins`)
        self.absent = set(absent)
        if not self.absent < set(self.workers) or (self.absent and joins is None):
            raise ValueError(f"absent must be some of worker_ranks {list(self.workers)}, "
                             f"with joins, got {sorted(self.absent)}")
        self.numel = numel
        self.sum_numel = numel if sum_numel is None else sum_numel
        self.linger = linger
        self.known_lost = known_lost
        self.gone = gone
        self.joins = joins
        self.rule = rule
        self.timeout = None if timeout is None else resolve_timeout(timeout)
        self.stats = ServerStats(per_worker={w: 0 for w in self.workers})
        #: a virtual clock's link (`hetsync.clock.Link`): requests are served in the order
        #: they reach the server on the workers' virtual clocks, and each reply says when it
        #: reaches its worker (None: the wall clock, in arrival order)
        self.link = link
        #: a virtual clock's server work: seconds per byte of a request and its reply (0: the
        #: rule's work is free); a request is served once the server has served those before
        self.work_s_per_byte = work_s_per_byte
        self._in_free = self._out_free = 0.0  # when the server's link is free, each way
        self._work_free = 0.0                 # when the server has served what came before
        self._replied: dict[int, float] = {}   # when the last reply reaches a worker
        self._view: GroupView | None = None
        #: worker -> (view, its group rank) where it is served apart from the default group
        self._links: dict[int, tuple[GroupView, int]] = {}

    #: how often `joins` is asked, at most
    JOIN_POLL_S = 0.5
    #: the longest refused payload drained where the model's length is not known
    DRAIN_NUMEL = 1 << 24

    # -- transport -----------------------------------------------------------------------
    def _transfer(self, worker: int, ops, op: str, timeout: float | None = None,
                  room: int = 1) -> None:
        """`ops` (each naming `worker`) on `worker`'s link: the default group, or its own
        (`room`: as `p2p.transfer`'s)."""
        view, peer = self._links.get(worker, (self._view, worker))
        sent, recv = p2p.transfer([(kind, t, peer, *tag) for kind, t, _, *tag in ops],
                                  view=view, op=op,
                                  timeout=timeout or resolve_timeout(self.timeout), room=room)
        self.stats.bytes_sent += sent
        self.stats.bytes_recv += recv

    def _reply_ops(self, worker: int, seq: int, payload: Payload,
                   checked: bool = False, time: float = 0.0) -> list[tuple]:
        """A REPLY carrying `payload` (`checked`: with its checksum, wire field 12; `time`:
        when it reaches the worker on the virtual clock, field 13)."""
        header = Header(op=Op.REPLY, sender=self._view.rank, seq=seq, **describe(payload),
                        checksum=checksum(payload) if checked and payload is not None else 0,
                        time=time)
        return [(SEND, header.encode(), worker, TAG_REPLY)] + \
            [(SEND, t, worker, TAG_REPLY_PAYLOAD) for t in payload_tensors(payload)]

    def _error_ops(self, worker: int, seq: int, status: Status, detail: int) -> list[tuple]:
        header = Header(op=Op.ERROR, sender=self._view.rank, seq=seq, status=status,
                        detail=detail)
        return [(SEND, header.encode(), worker, TAG_REPLY)]

    def _send_error_quietly(self, worker: int, seq: int, status: Status, detail: int,
                            op: str) -> None:
        """Best effort: tell ``worker`` why it is refused; never masks the real error."""
        try:
            self._transfer(worker, self._error_ops(worker, seq, status, detail), op,
                           timeout=min(resolve_timeout(self.timeout), 5.0))
        except CommError:
            pass

    # -- loop ----------------------------------------------------------------------------
    def serve(self) -> ServerStats:
        """Serve until every worker has sent BYE or is lost (with ``joins``, and none said
        goodbye: once none has come back within the timeout); return :attr:`stats`."""
        self._view = GroupView.of(None)
        me = self._view.rank
        if me in self.workers:
            raise ValueError(f"the server's own rank {me} is in worker_ranks {self.workers}")
        bad = [w for w in self.workers if w >= self._view.size]
        if bad:
            raise ValueError(f"worker_ranks {bad} are outside the world of size "
                             f"{self._view.size}")
        open_workers = set(self.workers) - self.absent
        next_seq = {w: 0 for w in self.workers}
        next_round = {w: 0 for w in self.workers}
        closed_at: dict[int, int] = {}          # worker -> first round it will never join
        rounds: dict[int, dict[int, tuple[int, torch.Tensor]]] = {}

        def close(worker: int) -> None:
            """`worker` is gone (BYE, or refused): abort the sum rounds it will never join."""
            open_workers.discard(worker)
            closed_at[worker] = next_round[worker]
            for r in sorted(k for k in rounds if k >= next_round[worker]):
                for w, (s, _) in sorted(rounds.pop(r, {}).items()):  # (a nested close took it)
                    self._send(w, self._error_ops(w, s, Status.ROUND_ABORTED, r),
                               OP_NAMES[Op.SUM], lose)

        def lose(worker: int) -> None:
            """`worker`'s connection failed mid-request: it died; the others go on."""
            held.pop(worker, None)
            if worker in open_workers:
                self.stats.lost.append(worker)
                close(worker)
                if self.gone is not None:
                    self.gone(worker, "was lost: the parameter server saw its connection close")

        def refuse(worker: int, field: str | None, error: str) -> None:
            """`worker` sent what the server cannot take (it was told why): served no more."""
            self.stats.refused.append({"rank": worker, "field": field, "error": error})
            close(worker)
            if self.gone is not None:
                self.gone(worker, f"was refused by the parameter server: {error}")

        #: the virtual clock's requests waiting their turn: worker -> (arrival, header, payload)
        held: dict[int, tuple[float, Header, Payload]] = {}
        #: the earliest a worker's next request can reach the server (the virtual clock)
        earliest = {w: 0.0 for w in self.workers}
        #: the virtual clock: workers served again (`rejoin`) whose new process has sent no
        #: request yet. None is waited for: its first request comes when it comes in real
        #: time (after its start, its shard handed back by a worker that may be waiting on
        #: this server), and reaches the server at the server's time then, not at its own
        #: new clock's
        fresh: set[int] = set()

        def handle(src: int, header: Header, payload: Payload) -> bool:
            """Serve one received request; whether it was a goodbye."""
            op = OP_NAMES[Op(header.op)]
            self.stats.requests[op.split("/")[1]] += 1
            self.stats.per_worker[src] += 1
            if header.op in (Op.PULL, Op.PUSH_PULL):
                try:
                    reply = self._apply(header, src, payload, op)
                except Exception as err:  # noqa: BLE001 - its request, not the run, failed
                    refuse(src, "rule", f"the server's rule failed on its {op}: "
                                        f"{type(err).__name__}: {err}")
                    return False
                # (a PULL is a worker's whole model, at its start, join or finish: checked)
                self._send(src, self._reply_ops(src, header.seq, reply,
                                                checked=header.op == Op.PULL,
                                                time=self._virtual_reply(src, header, reply)),
                           op, lose)
            elif header.op == Op.SUM:
                next_round[src] += 1
                r = header.round
                if any(c <= r for c in closed_at.values()):
                    self._send(src, self._error_ops(src, header.seq, Status.ROUND_ABORTED, r),
                               op, lose)
                    return False
                rounds.setdefault(r, {})[src] = (header.seq, payload)
                if len(rounds[r]) == len(self.workers):
                    self._finish_round(rounds.pop(r), op, lose)
            else:  # BYE
                self._send(src, self._reply_ops(src, header.seq, None), op, lambda w: None)
                close(src)
                return True
            return False

        def serve_held(transfer: float = 0.0) -> bool:
            """The virtual clock: serve the held requests, first come first, while no open
            worker can still send one that reaches the server before them (`earliest`); again
            after a worker is lost or refused, which no held request may wait on any more.
            `transfer`: the last request's seconds on the link, taken as its sender's next's
            (0: none came, an earlier bound, which only waits longer). Whether one said BYE."""
            bye = False
            summing = {w for parts in rounds.values() for w in parts}
            while held:
                first = min(held, key=lambda w: (held[w][0], w))
                others = [(earliest[w], w) for w in open_workers
                          if w not in held and w not in summing and w not in fresh]
                if others and min(others) < (held[first][0], first):
                    break  # one of them may yet send an earlier request
                _, header, payload = held.pop(first)
                busy_from = time.perf_counter()
                bye = handle(first, header, payload) or bye
                self.stats.busy_s += time.perf_counter() - busy_from
                replied = self._replied.pop(first, None)
                if replied is not None:
                    earliest[first] = max(earliest[first], replied + transfer)
            return bye

        said_bye = False  # a worker said goodbye: the run is over, the silent may be lost
        # (room for a longer header than ours, so that one is refused, not gloo's abort)
        inbox = p2p.Inbox(self.workers, numel=HEADER_ROOM, dtype=torch.int64, view=self._view,
                          op="ps/serve", tag=TAG_REQUEST, fill=HEADER_FILL)
        heard = joins_asked = time.monotonic()  # the last request's arrival; the last `joins`

        def rejoin(worker: int, view: GroupView) -> None:
            """`worker`'s new process linked: serve it on `view` from now, afresh."""
            self._links[worker] = (view, view.global_ranks.index(worker))
            inbox.relink(worker, view, self._links[worker][1])
            open_workers.add(worker)
            self.absent.discard(worker)
            closed_at.pop(worker, None)
            next_seq[worker] = 0
            fresh.add(worker)
            self.stats.rejoined.append(worker)

        def awaiting() -> bool:
            """Every worker lost, none said goodbye: one may yet come back (`joins`)."""
            return (self.joins is not None and not said_bye
                    and time.monotonic() - heard < resolve_timeout(self.timeout))

        try:
            while open_workers or awaiting():
                if self.joins is not None and not said_bye and \
                        time.monotonic() - joins_asked >= self.JOIN_POLL_S:
                    joins_asked = time.monotonic()
                    for worker, view in self.joins(sorted((set(self.stats.lost) | self.absent)
                                                          - open_workers)):
                        rejoin(worker, view)
                for worker in sorted(open_workers - inbox.asked):  # each open one's next header
                    inbox.ask(worker)
                if said_bye and self.known_lost is not None:  # none of them will say goodbye
                    for worker in sorted(set(self.known_lost()) & open_workers):
                        lose(worker)
                    if not open_workers:
                        break
                timeout = resolve_timeout(self.timeout)
                lingering = self.linger is not None and said_bye
                if lingering:
                    timeout = min(timeout, self.linger)
                try:  # (waking for `joins` in between)
                    src, raw = inbox.get(timeout if self.joins is None else
                                         max(0.0, min(timeout - (time.monotonic() - heard),
                                                      self.JOIN_POLL_S)))
                    heard = time.monotonic()
                except CommTimeoutError as exc:
                    if time.monotonic() - heard < timeout:
                        continue
                    if lingering:  # the others have finished: the silent ones are gone
                        for worker in sorted(open_workers):
                            lose(worker)
                        break
                    raise CommTimeoutError(
                        f"ps/serve: no request within {timeout:g} s from any of the workers still "
                        f"open {sorted(open_workers)}", op="ps/serve", seconds=timeout) from exc
                except CommError as exc:  # its connection closed, idle or mid-header: it died
                    heard = time.monotonic()
                    lose(exc.peer)
                    said_bye = serve_held() or said_bye  # (what waited on it goes now)
                    continue
                raw = received_fields(raw)
                seq = int(raw[Field.SEQ]) if len(raw) > Field.SEQ else 0
                busy_from = time.perf_counter()
                try:
                    header, payload = self._receive(raw, src, next_seq[src], next_round[src],
                                                    rounds)
                except ProtocolError as err:
                    # Refuse that worker, not the run: it is told why, and served no more.
                    detail = Field[err.field.upper()] if err.field and \
                        err.field.upper() in Field.__members__ else 0
                    status = Status.BAD_PAYLOAD if err.field == "payload" else Status.BAD_HEADER
                    if err.field != "payload":
                        self._drain(raw, src)
                    self._send_error_quietly(src, seq, status, int(detail), "ps/serve")
                    refuse(src, err.field, str(err))
                    said_bye = serve_held() or said_bye
                    continue
                except CommError:  # its payload never came: it died mid-request
                    lose(src)
                    said_bye = serve_held() or said_bye
                    continue
                next_seq[src] += 1
                if self.link is None:
                    said_bye = handle(src, header, payload) or said_bye
                    self.stats.busy_s += time.perf_counter() - busy_from
                    continue
                self.stats.busy_s += time.perf_counter() - busy_from
                # The virtual clock: the request that reaches the server first is served once
                # no open worker can still send one that arrives before it (conservative: a
                # worker sends no request before its last reply reached it, nor before its
                # last request; `earliest`), so the order does not depend on the real one.
                # A sum's part is taken as it comes: the sum does not depend on the order of
                # its parts (added in rank order), the workers' clocks meet after it at the
                # collective's price, and its sender sends nothing until the sum reaches it.
                arrival = self.link.message_seconds(HEADER_BYTES + header.payload_bytes)
                if src in fresh:  # a new process's first request: it joins now (`fresh`)
                    fresh.discard(src)
                    header = dataclasses.replace(header, time=max(header.time, self._in_free))
                earliest[src] = max(earliest[src], arrival + header.time)
                if header.op == Op.SUM:
                    busy_from = time.perf_counter()
                    said_bye = handle(src, header, payload) or said_bye
                    self.stats.busy_s += time.perf_counter() - busy_from
                else:
                    held[src] = (arrival + header.time, header, payload)
                said_bye = serve_held(arrival) or said_bye
        finally:
            inbox.close()
        return self.stats

    def _drain(self, raw: torch.Tensor, src: int) -> None:
        """Receive and drop the payload of a refused request whose header speaks this wire
        (its magic, version and a request's op) with sizes sane and within bounds, whatever
        else it got wrong (a PULL that carries one, say): its sender posted the payload with
        the header and would otherwise wait on it until its timeout instead of reading the
        refusal."""
        v = [int(x) for x in raw.tolist()]
        if len(v) != HEADER_LEN or v[Field.MAGIC_VERSION] != MAGIC_VERSION or \
                v[Field.OP] not in REQUESTS:
            return  # its sizes cannot be trusted
        kind, dtype, numel, nnz = (v[f] for f in (Field.KIND, Field.DTYPE, Field.NUMEL,
                                                  Field.NNZ))
        if kind not in (Kind.DENSE, Kind.SPARSE) or dtype not in DTYPE_CODES or \
                not 0 <= nnz <= numel <= (self.sum_numel or self.DRAIN_NUMEL) or \
                (kind == Kind.DENSE and nnz != numel):
            return
        bufs, _ = receive_buffers(Header(op=Op.PUSH_PULL, sender=src, seq=0, kind=kind,
                                         dtype=dtype, numel=numel, nnz=nnz), PAYLOAD_ROOM)
        try:
            self._transfer(src, [(RECV, b, src, TAG_REQUEST_PAYLOAD) for b in bufs], "ps/serve",
                           timeout=min(resolve_timeout(self.timeout), 5.0), room=PAYLOAD_ROOM)
        except CommError:
            pass

    def _receive(self, raw: torch.Tensor, src: int, seq: int, round_: int, rounds: dict) -> tuple[Header, Payload]:
        """Check the header `raw` from `src` and receive its payload; ProtocolError on
        anything it does not understand or cannot trust."""
        header = decode(raw, src)
        if header.seq != seq:
            raise ProtocolError(
                f"refused header from rank {src}: field 'seq' = {header.seq}: "
                f"expected {seq}", peer=src, field="seq", value=header.seq)
        if header.op == Op.PUSH_PULL and self.numel is not None and header.numel != self.numel:
            raise ProtocolError(
                f"refused header from rank {src}: field 'numel' = {header.numel}: a push "
                f"must have the model's {self.numel} elements", peer=src, field="numel",
                value=header.numel)
        if header.op == Op.SUM and self.sum_numel is not None and header.numel > self.sum_numel:
            raise ProtocolError(
                f"refused header from rank {src}: field 'numel' = {header.numel}: a sum has "
                f"at most {self.sum_numel} elements here", peer=src, field="numel",
                value=header.numel)
        if header.op == Op.SUM:
            self._check_sum(header, round_, rounds)
        op = OP_NAMES[Op(header.op)]
        meter.add(op, 0, HEADER_BYTES)
        self.stats.bytes_recv += HEADER_BYTES
        # (room for a longer payload than announced, so that one is refused, not gloo's abort)
        bufs, payload = receive_buffers(header, room=PAYLOAD_ROOM)
        self._transfer(src, [(RECV, b, src, TAG_REQUEST_PAYLOAD) for b in bufs], op,
                       room=PAYLOAD_ROOM)
        if overran(bufs, header):
            raise ProtocolError(f"refused payload from rank {src}: longer than the "
                                f"{header.nnz} elements of {DTYPE_CODES[header.dtype]} its "
                                f"header announced", peer=src, field="payload")
        values = payload.values if isinstance(payload, SparseMessage) else payload
        if values is not None and not bool(torch.isfinite(values).all()):
            # receive_buffers fills with NaN: a payload shorter than announced shows here too
            raise ProtocolError(f"refused payload from rank {src}: non-finite values, or "
                                f"fewer than the {header.nnz} its header announced",
                                peer=src, field="payload")
        verify(header, payload, src)
        if isinstance(payload, SparseMessage) and payload.nnz:
            lo, hi = int(payload.indices.min()), int(payload.indices.max())
            if lo < 0 or hi >= payload.numel:
                raise ProtocolError(
                    f"refused payload from rank {src}: sparse indices span [{lo}, {hi}] "
                    f"outside [0, numel={payload.numel})", peer=src, field="payload",
                    value=lo if lo < 0 else hi)
        return header, payload

    def _check_sum(self, header: Header, expected_round: int,
                   rounds: dict[int, dict[int, tuple[int, torch.Tensor]]]) -> None:
        src = header.sender
        if header.round != expected_round:
            raise ProtocolError(f"refused header from rank {src}: field 'round' = "
                                f"{header.round}: expected {expected_round}", peer=src,
                                field="round", value=header.round)
        filed = rounds.get(header.round)
        if filed:
            other, (_, first) = next(iter(filed.items()))
            dtype = describe(first)["dtype"]
            if header.dtype != dtype:
                raise ProtocolError(f"refused header from rank {src}: field 'dtype' = "
                                    f"{header.dtype}: rank {other} pushed dtype code {dtype} "
                                    f"for round {header.round}", peer=src, field="dtype",
                                    value=header.dtype)
            if header.numel != first.numel():
                raise ProtocolError(f"refused header from rank {src}: field 'numel' = "
                                    f"{header.numel}: rank {other} pushed {first.numel()} "
                                    f"elements for round {header.round}", peer=src,
                                    field="numel", value=header.numel)

    def _virtual_reply(self, worker: int, header: Header, reply: Payload) -> float:
        """On the virtual clock, when the reply to `header`'s request reaches its worker:

        1. the request comes in through the server's link after the ones before it;
        2. the server serves it once it has served those before, in (request + reply bytes)
           × `work_s_per_byte` (0: at once, the rule's work taken as free);
        3. its reply goes out through the same link after the replies before it.

        (0.0: the wall clock.)"""
        if self.link is None:
            return 0.0
        reply_bytes = HEADER_BYTES + Header(op=Op.REPLY, sender=0, seq=0,
                                            **describe(reply)).payload_bytes
        request_bytes = HEADER_BYTES + header.payload_bytes
        per_byte = 1.0 / self.link.bytes_per_s
        received = max(header.time + self.link.latency_s, self._in_free) + request_bytes * per_byte
        self._in_free = received
        self._work_free = (max(received, self._work_free)
                           + (request_bytes + reply_bytes) * self.work_s_per_byte)
        self._out_free = max(self._work_free, self._out_free) + reply_bytes * per_byte
        self._replied[worker] = self._out_free + self.link.latency_s
        return self._replied[worker]

    def _apply(self, header: Header, src: int, payload: Payload, op: str) -> Payload:
        """The rule's answer, checked to be sendable; on failure ERROR to ``src``, raise."""
        try:
            if self.rule is None:
                raise RuntimeError(f"ParameterServer has no rule to answer {op} from rank "
                                   f"{src}; pass rule=...")
            if header.op == Op.PULL:
                reply = self.rule.pull(src)
            else:
                if header.rate is not None and hasattr(self.rule, "lr"):  # its schedule
                    self.rule.lr = header.rate
                reply = self.rule.push(src, payload)
            describe(reply)   # ValueError: the rule returned something the wire cannot carry
            return reply
        except Exception:
            self._send_error_quietly(src, header.seq, Status.RULE_FAILED, 0, op)
            raise

    def _send(self, worker: int, ops: list[tuple], op: str, lose) -> None:
        """Send `ops` to `worker`; if its connection fails, it died: ``lose(worker)``."""
        try:
            self._transfer(worker, ops, op)
        except CommError:
            lose(worker)

    def _finish_round(self, pushes: dict[int, tuple[int, torch.Tensor]], op: str,
                      lose) -> None:
        order = sorted(pushes)
        total = pushes[order[0]][1]
        for w in order[1:]:
            total.add_(pushes[w][1])
        for w in order:
            self._send(w, self._reply_ops(w, pushes[w][0], total), op, lose)
        self.stats.sum_rounds += 1


class PSClient:
    """A worker's connection to the parameter server at global rank ``server_rank``.

    Args:
        server_rank: the server's global rank (by convention the last one).
        timeout: seconds to wait for each request's round trip; ``None``: the process-wide
            default at the time of the call.

    Thread-safe (one request at a time). Close it (or use ``with``) so the server can stop.
    """

    def __init__(self, server_rank: int, timeout: float | None = None):
        self._view = GroupView.of(None)
        if isinstance(server_rank, bool) or not isinstance(server_rank, int) or \
                not 0 <= server_rank < self._view.size:
            raise ValueError(f"server_rank must be a global rank in [0, {self._view.size}), "
                             f"got {server_rank!r}")
        if server_rank == self._view.rank:
            raise ValueError(f"server_rank {server_rank} is this process's own rank")
        self.server_rank = server_rank
        self.rank = self._view.rank
        self._server = server_rank  # the server's rank in `_view`
        self.timeout = None if timeout is None else resolve_timeout(timeout)
        self.closed = False
        self._seq = 0
        self._round = 0
        self._lock = threading.Lock()
        #: a virtual clock (`hetsync.clock.VirtualClock`): each request carries its time, and
        #: a PULL's or PUSH_PULL's reply moves it to when the reply arrives (a SUM's is the
        #: collective's, timed by its caller)
        self.clock = None

    def use_link(self, view: GroupView) -> None:
        """Talk to the server over `view` from now on, its requests numbered afresh: a
        group of this worker and the server alone (a lost worker's new process,
        ``runtime/server_link.py``)."""
        with self._lock:
            self._view, self._server = view, view.global_ranks.index(self.server_rank)
            self._seq = 0

    def _request(self, op: Op, payload: Payload, *, name: str, timeout, round: int = 0,
                 rate: float | None = None) -> Payload:
        if self.closed:
            raise RuntimeError(f"PSClient to rank {self.server_rank} is closed")
        t = resolve_timeout(timeout if timeout is not None else self.timeout)
        server, peer = self.server_rank, self._server
        header = Header(op=op, sender=self.rank, seq=self._seq, round=round, rate=rate,
                        time=self.clock.now() if self.clock is not None else 0.0,
                        **describe(payload))
        raw = torch.empty(HEADER_LEN, dtype=torch.int64)
        deadline = time.monotonic() + t
        answer = p2p.post(RECV, raw, peer, view=self._view, op=name, timeout=t, tag=TAG_REPLY)
        sends = [p2p.post(SEND, header.encode(), peer, view=self._view, op=name, timeout=t,
                          tag=TAG_REQUEST)]
        sends += [p2p.post(SEND, x, peer, view=self._view, op=name, timeout=t,
                           tag=TAG_REQUEST_PAYLOAD) for x in payload_tensors(payload)]
        answer.wait(deadline)
        sends[0].wait(deadline)
        self._seq += 1
        reply = decode(raw, server, expect=(Op.REPLY, Op.ERROR))
        if reply.op != Op.ERROR:  # (refused, its payload may never be read: not waited for)
            for pending in sends[1:]:
                pending.wait(deadline)
        if reply.seq != header.seq:
            raise ProtocolError(f"refused reply from rank {server}: field 'seq' = {reply.seq}: "
                                f"expected {header.seq}", peer=server, field="seq",
                                value=reply.seq)
        if reply.op == Op.ERROR:
            if reply.status in (Status.BAD_HEADER, Status.BAD_PAYLOAD):
                self.closed = True  # the server serves this worker no more: no goodbye
            raise CommError(f"{name}: parameter server (rank {server}) refused request "
                            f"{header.seq} from rank {self.rank}: {_explain(reply)}",
                            op=name, peer=server)
        bufs, result = receive_buffers(reply)
        p2p.transfer([(RECV, b, peer, TAG_REPLY_PAYLOAD) for b in bufs], view=self._view,
                     op=name, timeout=t)
        verify(reply, result, server)
        if self.clock is not None and op in (Op.PULL, Op.PUSH_PULL):
            self.clock.arrive(reply.time)
        return result

    def pull(self, *, timeout: float | None = None) -> Payload:
        """Ask for the server rule's view (``rule.pull``); returns a flat tensor or sparse."""
        with self._lock:
            return self._request(Op.PULL, None, name=OP_NAMES[Op.PULL], timeout=timeout)

    def push_pull(self, update: torch.Tensor | SparseMessage, *,
                  timeout: float | None = None, rate: float | None = None) -> Payload:
        """Send ``update``; the server applies it at once (``rule.push``) and its return value
        comes back (a flat tensor, a :class:`SparseMessage` or ``None``). ``rate``: the
        learning rate the rule applies from now on (the worker's schedule; None: as it
        was)."""
        if update is None:
            raise ValueError("update must be a Tensor or SparseMessage, got None")
        if rate is not None and not (0 <= rate <= MAX_RATE and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number in [0, {MAX_RATE:g}], got {rate!r}")
        with self._lock:
            return self._request(Op.PUSH_PULL, update, name=OP_NAMES[Op.PUSH_PULL],
                                 timeout=timeout, rate=rate)

    def sum(self, tensor: torch.Tensor, *, timeout: float | None = None,
            _op: str = OP_NAMES[Op.SUM]) -> torch.Tensor:
        """Synchronous sum over all the server's workers, written into ``tensor`` in place."""
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        with self._lock:
            r = self._round
            result = self._request(Op.SUM, tensor, name=_op, timeout=timeout, round=r)
            self._round += 1
        if not isinstance(result, torch.Tensor) or result.numel() != tensor.numel() or \
                result.dtype != tensor.dtype:
            raise ProtocolError(f"{_op}: reply from rank {self.server_rank} to sum round {r} "
                                f"does not match the pushed {tensor.numel()} x {tensor.dtype}",
                                peer=self.server_rank, field="numel", op=_op)
        with torch.no_grad():
            tensor.copy_(result.view(tensor.shape))
        return tensor

    def close(self, *, timeout: float | None = None) -> None:
        """Say goodbye (waits for the server's acknowledgement). Idempotent."""
        with self._lock:
            if self.closed:
                return
            try:
                self._request(Op.BYE, None, name=OP_NAMES[Op.BYE], timeout=timeout)
            finally:
                self.closed = True

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            try:
                self.close(timeout=5.0)
            except Exception:  # noqa: BLE001 - do not mask the original error
                pass


_default_lock = threading.Lock()
_default: PSClient | None = None


def connect(server_rank: int, timeout: float | None = None) -> PSClient:
    """Create this process's default :class:`PSClient` (used by ``all_reduce(t, "ps")``)."""
    global _default
    with _default_lock:
        if _default is not None and not _default.closed:
            raise RuntimeError(f"already connected to the parameter server at rank "
                               f"{_default.server_rank}; call disconnect() first")
        _default = PSClient(server_rank, timeout=timeout)
        return _default


def default_client() -> PSClient | None:
    """The client made by :func:`connect`, or ``None`` (also once it was closed)."""
    with _default_lock:
        return _default if _default is not None and not _default.closed else None


def disconnect(timeout: float | None = None) -> None:
    """Close and forget the default client (no-op when there is none)."""
    global _default
    with _default_lock:
        client, _default = _default, None
    if client is not None:
        client.close(timeout=timeout)
