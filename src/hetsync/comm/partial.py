"""eager-SGD's partial all-reduce (Li et al., "Taming Unbalanced Training Workloads in Deep
Learning with Partial Collective Operations", PPoPP'20), over torch.distributed.

A round sums one flat buffer over every rank, but starts before every rank has arrived: the
ranks that have not posted a gradient yet contribute zeros, and their gradient joins a later
round. A progress engine per rank (:meth:`PartialAllReduce.run`, one job on the worker's
background channel, with the channel's own group) runs the rounds, so a rank that is still
computing takes part. Round r, on every rank:

1. **activation** — *solo*: the first rank to arrive (post a gradient) starts the round;
   *majority*: the initiator is drawn for the round from a seed shared by every rank (so in
   expectation half the ranks have arrived when it does), and only its arrival starts the
   round. A rank's arrival adds the round's key in the process group's key-value store, on
   which every engine waits (the published library forwards 4-byte activation messages by
   recursive doubling; gloo cannot test a posted receive without blocking on it, so hetsync
   lets the store wake the waiting engines). Every (K+1)-th round is *synchronous*: every rank
   waits for its own arrival (solo: K = 32 by default, the published code's limiter;
   majority: off by default, since its published code has the line commented out);
2. **contribution** — a rank contributes what it has posted since its last contribution (its
   carry-over: a late gradient is kept, never dropped or overwritten), else zeros, with a
   count of fresh contributions;
3. **sum** — one all-reduce of [buffer, fresh, stopping] over the chosen collective; the mean
   is the sum ÷ P (as the published code) or ÷ the number of fresh contributions (`divide`);
4. the round's mean is kept for the rank's main thread, which applies every round, in order,
   so that all replicas apply the same updates (the published code reads whichever result
   buffer is newest, and the slow rank's model drifts; its harness copies rank 0's model
   every 10 epochs). Each contribution's staleness — rounds between the model it was computed
   on and the round that carried it — is recorded.

**On a virtual clock** (`hetsync.clock`; `clock` given) the order of arrivals is the
clocks', not the real machine's. Every round, each engine first waits (in real time) until its
own main thread has posted, is finishing or has joined, so that it knows its rank's arrival
time a_i on its clock; one all-reduce of the arrival times gives the round's start — solo:
min a_i; majority: the initiator's a_j; a synchronous round: max a_i — and no earlier than
the previous round's end. A rank contributes its gradient only if it had arrived by then
(a_i <= start); otherwise the gradient waits for a later round, as a late one does on the
wall clock. The round ends its all-reduce's modelled cost later, and a main thread that
waited for a round moves its clock to that round's end. An engine never runs past the round
that carries its own rank's gradient (it waits for the next post), so which rounds a main
thread applies is decided by the clocks alone.

**Ending.** A rank that is done (:meth:`finish`) arrives with a stopping flag; the round after
the first one that carries it is a final synchronous round, for which every rank waits for its
own main thread to post or finish (the training loop's stop is already agreed by then), so
that every rank runs the same rounds and no gradient is lost.
"""

from __future__ import annotations

import datetime
import math
import random
import threading
import time
from collections import deque
from typing import Callable

import torch

from .errors import CommError, CommTimeoutError
from .topology import GroupView

INITIATORS = ("solo", "majority")
DIVISORS = ("workers", "fresh")


class PartialAllReduce:
    """The rounds of one rank (see the module docstring).

    Args:
        numel: length of the flat buffer.
        initiator: ``"solo"`` or ``"majority"``.
        sync_every: K: every (K+1)-th round is synchronous; 0: never.
        divide: ``"workers"`` (÷ P) or ``"fresh"`` (÷ the fresh contributions).
        seed: majority's shared seed for drawing initiators.
        collective: the all-reduce algorithm of :func:`hetsync.comm.all_reduce`.
        timeout: seconds any wait may take.
        store: the key-value store activations go through (default: the default process
            group's); its keys are `prefix`/ENGINE/ROUND, ENGINE counting the engines this
            process made (every rank makes the same engines in the same order).
        device: where the buffers travel (the model's device under NCCL).
        clock: the worker's virtual clock (`hetsync.clock.VirtualClock`), read and moved on
            the main thread; None: the wall clock decides the order.
    """

    _made = 0  # engines made in this process

    def __init__(self, numel: int, *, initiator: str = "solo", sync_every: int = 32,
                 divide: str = "workers", seed: int = 0, collective: str = "native",
                 timeout: float = 120.0, store=None, prefix: str = "hetsync/eager",
                 device: torch.device | str = "cpu", clock=None):
        if initiator not in INITIATORS:
            raise ValueError(f"initiator must be one of {', '.join(INITIATORS)}, got "
                             f"{initiator!r}")
        if divide not in DIVISORS:
            raise ValueError(f"divide must be one of {', '.join(DIVISORS)}, got {divide!r}")
        if sync_every < 0:
            raise ValueError(f"sync_every must be >= 0, got {sync_every}")
        self.numel, self.initiator, self.sync_every = numel, initiator, sync_every
        self.divide, self.seed, self.collective, self.timeout = divide, seed, collective, timeout
        self._cond = threading.Condition()
        self._pending: torch.Tensor | None = None  # posted, not yet contributed
        self._pending_version = 0
        self._posted = 0             # tickets handed out
        self._included = 0           # tickets carried by completed rounds
        self._finishing = False
        self._joined = False         # this rank's data ran out; the others' rounds go on
        self._done = False
        self._failure: BaseException | None = None
        self._results: deque[tuple[int, torch.Tensor]] = deque()
        self._next = 0               # the round the next contribution goes to
        self.rank, self.size = 0, 1  # in the engine's group (set by `run`)
        PartialAllReduce._made += 1
        self._store, self._prefix = store, f"{prefix}/{PartialAllReduce._made}"
        self.device = torch.device(device)
        self._waits = None           # the engine thread's own clone of the store
        self.rounds = 0              # rounds completed
        self.staleness: list[int] = []  # of this rank's fresh contributions, in order
        # the virtual clock's: when the pending gradient (or the finish, or the join)
        # arrived; the previous round's end; the (last ticket carried, round end) of each
        # round that carried this rank's gradients
        self.clock = clock
        self._arrived = {"pending": 0.0, "finish": 0.0, "join": 0.0}
        self._pending_tickets = 0
        self._round_end = 0.0
        self._carried: deque[tuple[int, float]] = deque()

    # ------------------------------------------------------------------ the main thread
    def post(self, grad: torch.Tensor, version: int) -> int:
        """Hand over this step's gradient, computed on the model after `version` rounds;
        returns its ticket for :meth:`wait_for`."""
        with self._cond:
            if self._done:
                raise RuntimeError("eager-SGD: a gradient was posted after the final round")
            flat = grad.detach().reshape(-1).to(self.device, torch.float32)
            if self._pending is None:
                self._pending, self._pending_version = flat.clone(), version
                self._arrived["pending"] = self._now()
            else:
                self._pending += flat
            self._posted += 1
            self._pending_tickets += 1
            self._cond.notify_all()
            ticket, target = self._posted, self._next
        self._activate(target)
        return ticket

    def wait_for(self, ticket: int, alarm: Callable[[], bool] | None = None) -> None:
        """Block until a completed round carries the gradient of `ticket` (bounded); with an
        `alarm` (`runtime/membership.py`), raise PeerLost as soon as it goes off."""
        from .channel import ChannelFuture, PeerLost

        end = time.monotonic() + self.timeout
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._included >= ticket or self._failure
                                       is not None or self._done,
                                       timeout=min(ChannelFuture.ALARM_EVERY,
                                                   max(end - time.monotonic(), 0.0))):
                    self._raise_failure()
                    self._arrive_at_carrier(ticket)
                    return
            if time.monotonic() >= end:
                raise CommTimeoutError(f"eager-SGD: no round carried this rank's gradient "
                                       f"within {self.timeout:g} s (a peer dead or silent?)",
                                       op="eager/round", seconds=self.timeout)
            if alarm is not None and alarm():  # (the store, asked outside the lock)
                raise PeerLost("eager-SGD rounds: given up, a peer was lost", op="eager/round")

    def _arrive_at_carrier(self, ticket: int) -> None:
        """Virtual clock: the main thread's clock moves to the end of the round that carried
        `ticket` (under the lock)."""
        while self._carried and self._carried[0][0] < ticket:
            self._carried.popleft()
        if self.clock is not None and self._carried:
            self.clock.arrive(self._carried[0][1])

    def _now(self) -> float:
        return 0.0 if self.clock is None else self.clock.now()

    def take_results(self) -> list[tuple[int, torch.Tensor | None]]:
        """The means of the rounds completed since the last call, in round order (None: the
        round carried no gradient)."""
        with self._cond:
            self._raise_failure()
            out = list(self._results)
            self._results.clear()
            return out

    def join(self) -> None:
        """This rank's data has run out, the others' has not (`hetsync.wrap`'s agreed stop):
        its engine goes on taking part in their rounds, contributing zeros; it counts as
        arrived (a synchronous round does not wait for it) and starts the rounds it is the
        drawn initiator of (majority), until `finish`."""
        with self._cond:
            self._joined = True
            self._arrived["join"] = self._now()
            self._cond.notify_all()
            target = self._next
        if self.initiator_of(target) == self.rank:  # the engine may be waiting for it
            self._activate(target)

    def finish(self) -> None:
        """This rank is done: its engine ends after the final round (see the docstring)."""
        with self._cond:
            self._finishing = True
            self._arrived["finish"] = self._now()
            self._cond.notify_all()
            target = self._next
        self._activate(target)

    def finished_at(self) -> float:
        """Virtual clock: when the final round ended (0 on the wall clock)."""
        return self._round_end

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise CommError(f"eager-SGD rounds failed: {self._failure}", op="eager/round")

    # ------------------------------------------------------------------ the engine
    def run(self, group) -> int:
        """The engine: rounds until the final one (a job on the background channel);
        returns the number of rounds."""
        view = GroupView.of(group)
        self.rank, self.size = view.rank, view.size
        if self._store is None and self.size > 1:
            import torch.distributed as dist

            self._store = dist.distributed_c10d._get_default_store()
        # Its own connection: a thread blocked in a wait on a store client holds it, so the
        # main thread's arrivals (adds) need another.
        self._waits = self._store.clone() if self._store is not None else None
        with self._cond:  # an arrival before the engine knew its rank: start round 0 now
            arrived = self._pending is not None or self._finishing
        if arrived:
            self._activate(0)
        try:
            return self._rounds(view, group)
        except BaseException as exc:
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
            raise

    def _rounds(self, view: GroupView, group) -> int:
        from .collectives import all_reduce

        final = False
        while True:
            r = self.rounds
            synchronous = final or (self.sync_every > 0 and (r + 1) % (self.sync_every + 1) == 0)
            start = None
            if self.clock is not None:
                self._wait_arrival()
                start = self._virtual_start(r, synchronous, group)
            elif synchronous or view.size == 1:
                self._wait_arrival()
            else:
                if self._joined and self.initiator_of(r) == self.rank:
                    self._activate(r)  # its own arrival will never come
                self._wait_activation(r)
            buf, through = self._contribution(r, start)
            all_reduce(buf, algorithm=self.collective, group=group, timeout=self.timeout)
            fresh, stopping = float(buf[self.numel]), float(buf[self.numel + 1])
            divisor = view.size if self.divide == "workers" else max(fresh, 1.0)
            with self._cond:  # (a round that carried no gradient has nothing to apply)
                self._results.append((r, buf[:self.numel] / divisor if fresh > 0 else None))
                if start is not None:
                    self._round_end = start + self.clock.all_reduce_seconds(
                        self.collective, view.size, buf.numel() * buf.element_size())
                    if through > self._included:
                        self._carried.append((through, self._round_end))
                self._included = max(self._included, through)
                self.rounds = r + 1
                if final:
                    self._done = True
                self._cond.notify_all()
            if final:
                return self.rounds
            final = stopping > 0

    def initiator_of(self, r: int) -> int | None:
        """Majority: round r's drawn initiator (the same on every rank); solo: None (anyone)."""
        if self.initiator == "solo":
            return None
        return random.Random(self.seed * 1_000_003 + r).randrange(self.size)

    def _key(self, r: int) -> str:
        return f"{self._prefix}/{r}"

    def _activate(self, r: int) -> None:
        """This rank arrived for round `r`: start it, if this rank may (solo: any; majority:
        the round's initiator). A second arrival's add is harmless."""
        if self._store is None or self.size == 1:
            return
        first = self.initiator_of(r)
        if first is None or first == self.rank:
            self._store.add(self._key(r), 1)

    def _wait_activation(self, r: int) -> None:
        """Until round `r` is started: by this rank's own arrival or another's."""
        try:
            self._waits.wait([self._key(r)], datetime.timedelta(seconds=self.timeout))
        except Exception as exc:  # noqa: BLE001 - the store's timeout, named
            raise CommTimeoutError(
                f"eager-SGD: round {r} was not started within {self.timeout:g} s (its "
                f"initiator {'any rank' if self.initiator == 'solo' else self.initiator_of(r)}"
                f" dead or silent?): {exc}", op="eager/activate", seconds=self.timeout) from exc

    def _arrival(self, r: int, synchronous: bool) -> float:
        """Virtual clock: when this rank arrived for round `r` (inf: it does not start it)."""
        with self._cond:
            if self._pending is not None:
                mine = self._arrived["pending"]
            elif self._finishing:
                mine = self._arrived["finish"]
            else:  # joined: arrived for a synchronous round, and starts majority's own
                mine = (self._arrived["join"] if synchronous or
                        self.initiator_of(r) == self.rank else math.inf)
        if synchronous:
            return mine
        first = self.initiator_of(r)
        return mine if first is None or first == self.rank else math.inf

    def _virtual_start(self, r: int, synchronous: bool, group) -> float:
        """Virtual clock: round `r` starts at the first arrival (solo), the initiator's
        (majority) or the last (synchronous), and not before the previous round's end."""
        import torch.distributed as dist

        mine = self._arrival(r, synchronous)
        times = torch.tensor([-mine, mine], dtype=torch.float64, device=self.device)
        if self.size > 1:
            work = dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        first, last = -float(times[0]), float(times[1])
        return max(last if synchronous else first, self._round_end)

    def _wait_arrival(self) -> None:
        """Until this rank's main thread has posted (or is finishing)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending is not None or self._finishing
                                       or self._joined, timeout=self.timeout):
                raise CommTimeoutError(f"eager-SGD: this rank's main thread posted nothing "
                                       f"within {self.timeout:g} s", op="eager/round",
                                       seconds=self.timeout)

    def _contribution(self, r: int, start: float | None = None) -> tuple[torch.Tensor, int]:
        """[carry-over or zeros, fresh, stopping] and the last ticket it carries (on a
        virtual clock, `start`: what arrived after the round's start waits for a later one)."""
        buf = torch.zeros(self.numel + 2, device=self.device)
        with self._cond:
            self._next = r + 1
            through = self._posted
            if self._pending is not None and (start is None
                                              or self._arrived["pending"] <= start):
                buf[:self.numel] = self._pending
                buf[self.numel] = 1.0
                self.staleness.append(r - self._pending_version)
                self._pending, self._pending_tickets = None, 0
            elif self._pending is not None:
                through -= self._pending_tickets
            buf[self.numel + 1] = float(self._finishing and (
                start is None or self._arrived["finish"] <= start))
            return buf, through
