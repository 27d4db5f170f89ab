"""Cluster-wide decisions every worker must agree on: how many samples all have trained, whether
to evaluate now, whether to stop, whether to let lost workers join.

Rank 0 proposes (it knows the time budget, the epoch budget and the last test accuracy); the
others follow. The proposal travels by the mode's control path
(`hetsync.algorithms.base.ControlPath`): in collective modes every worker's four numbers are
summed — by an all-reduce of their own (blocking, or on the background channel), or at the
end of the mode's own blocking sum of the round — and every worker reads the same agreement
off the sum (`CollectiveControl`). In asynchronous modes there
is no common round, so they go through the process group's key-value store (`StoreControl`):
one atomic add per round for the sample count, one read of the stop key.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch

from hetsync.algorithms.base import PROPOSAL_LENGTH


@dataclass(frozen=True)
class Proposal:
    samples: int      # samples this worker trained since the last round
    evaluate: bool    # the leader (rank 0) wants to evaluate after this round
    stop: bool        # the leader (rank 0) wants to stop after this round
    admit: bool = False  # the leader offered lost ranks a place (`runtime/membership.py`)

    LENGTH: ClassVar[int] = PROPOSAL_LENGTH  # floats of `as_tensor()`

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([float(self.samples), float(self.evaluate), float(self.stop),
                             float(self.admit)])


@dataclass(frozen=True)
class Agreement:
    samples_seen: int  # by all workers, since the start
    evaluate: bool     # evaluate now (collective modes: every worker pauses for it)
    stop: bool
    admit: bool = False  # let the ranks offered a place join now


class CollectiveControl:
    """The workers' proposals were summed: read the agreement off the sum."""

    def __init__(self) -> None:
        self.samples_seen = 0

    def resume(self, samples_seen: int) -> None:
        """Count on from a checkpoint's samples (every worker, alike)."""
        self.samples_seen = samples_seen

    rejoin = resume  # after a regroup: from rank 0's count

    def agree(self, summed: torch.Tensor) -> Agreement:
        self.samples_seen += int(round(float(summed[0])))
        return Agreement(self.samples_seen, bool(summed[1] > 0), bool(summed[2] > 0),
                         bool(summed[3] > 0))


class LocalControl(CollectiveControl):
    """One worker: its proposal is the agreement."""

    def exchange(self, proposal: Proposal) -> Agreement:
        self.samples_seen += proposal.samples
        return Agreement(self.samples_seen, proposal.evaluate, proposal.stop)


class StoreControl:
    """Asynchronous modes: agreement through the torch.distributed store (no common round)."""

    SAMPLES, STOP = "hetsync/samples", "hetsync/stop"

    def __init__(self, store, rank: int, virtual: bool = False):
        self.store, self.rank = store, rank
        #: on a virtual clock (`hetsync.clock`) every worker stops by its own clock (each
        #: proposes its own stop at the time budget): the store's stop flag is read when the
        #: real machine gets there, which would make the run's end depend on its speed
        self.virtual = virtual

    def resume(self, samples_seen: int) -> None:
        """Count on from rank 0's checkpoint (the store's count is the cluster's: rank 0
        adds it once, before the workers start)."""
        if self.rank == 0:
            self.store.add(self.SAMPLES, samples_seen)

    def rejoin(self, samples_seen: int) -> None:
        """After a regroup: nothing to do, the store's count is the cluster's already."""

    def seen(self) -> int:
        """The cluster's count of samples so far (one store query)."""
        return int(self.store.add(self.SAMPLES, 0))

    def stopped(self) -> bool:
        """Whether the stop is agreed already (one store query)."""
        return int(self.store.add(self.STOP, 0)) > 0

    def exchange(self, proposal: Proposal) -> Agreement:
        seen = int(self.store.add(self.SAMPLES, proposal.samples))
        if proposal.stop:
            self.store.add(self.STOP, 1)
            stop = True
        else:
            stop = not self.virtual and self.stopped()
        # The leader evaluates alone (only it proposes to): the others keep training (no
        # round to pause at).
        return Agreement(seen, proposal.evaluate, stop)


class StoreJoin:
    """`hetsync.wrap`'s agreed stop for modes without a common round (the asynchronous ones):
    a worker whose data has run out counts itself in the store and waits until every worker
    has, so that all end together after the last push.

    1. every active worker bumps its heartbeat key at most once a second (`beat`);
    2. `wait_for_all` adds this worker to the count, then polls it (calling `meanwhile`: e.g.
       eager-SGD applies the rounds its engine still takes part in) until it is P;
    3. a worker that has neither joined nor beaten for `timeout` seconds is named in a
       `CommTimeoutError`: dead or stuck, it is not waited for forever — unless the mode can
       go on without it (`can_lose`: the asynchronous ones), where it is counted lost
       instead, as is one the parameter server marked lost (`mark_lost`: its connection
       closed), and the others end without it, naming it in a warning;
    4. every worker says when it reads the count no more (`left`: it saw P, or gave up);
       worker 0, whose process holds the store unless torchrun's agent does, waits (at
       most `timeout`, then warns) until all have, so that none still polling finds the
       store gone.
    """

    BEAT_EVERY = 1.0  # seconds
    POLL = 0.05

    def __init__(self, store, prefix: str, rank: int, workers: int, timeout: float, *,
                 can_lose: bool = False):
        self.store, self.prefix, self.rank = store, prefix, rank
        self.workers, self.timeout, self.can_lose = workers, timeout, can_lose
        self._last_beat = float("-inf")
        #: the workers this one ended without: lost (worker index -> why)
        self.lost: dict[int, str] = {}

    def _key(self, what: str, rank: int | None = None) -> str:
        return f"{self.prefix}/{what}" + ("" if rank is None else f"/{rank}")

    @staticmethod
    def mark_lost(store, prefix: str, worker: int, why: str) -> None:
        """Tell the workers that `worker` (its index among them) is gone for good (the
        parameter server saw its connection close): none waits for it at the stop."""
        try:
            store.set(f"{prefix}/lost/{worker}", why[:200])
        except Exception:  # noqa: BLE001 - the store is gone: nobody is waiting
            pass

    def marked_lost(self, worker: int) -> bool:
        """Whether `worker` was marked lost (`mark_lost`)."""
        return self.store.check([self._key("lost", worker)])

    def _lose(self, worker: int, why: str) -> None:
        self.lost[worker] = why
        warnings.warn(f"hetsync: worker {worker} {why}; the run ends without it",
                      RuntimeWarning, stacklevel=5)  # (the user's finish())

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat >= self.BEAT_EVERY:
            self.store.add(self._key("alive", self.rank), 1)
            self._last_beat = now

    def wait_for_all(self, meanwhile=lambda: None) -> None:
        self.store.set(self._key("joined", self.rank), "1")
        self.store.add(self._key("joined"), 1)
        try:
            self._until_all_joined(meanwhile)
        finally:  # this worker reads the count no more, whether it saw P or gave up
            try:
                self.store.set(self._key("left", self.rank), "1")
            except Exception:  # noqa: BLE001 - the store is gone: nobody waits for this
                pass
        if self.rank == 0:
            self._until_all_left()

    def _until_all_joined(self, meanwhile) -> None:
        from hetsync.comm.errors import CommTimeoutError

        others = [r for r in range(self.workers) if r != self.rank]
        seen = {r: (None, time.monotonic()) for r in others}
        while int(self.store.add(self._key("joined"), 0)) + len(self.lost) < self.workers:
            meanwhile()
            time.sleep(self.POLL)
            now = time.monotonic()
            for r in others:
                if r in self.lost or self.store.check([self._key("joined", r)]):
                    continue
                if self.can_lose and self.marked_lost(r):
                    self._lose(r, self.store.get(self._key("lost", r)).decode())
                    continue
                beats = int(self.store.add(self._key("alive", r), 0))
                if beats != seen[r][0]:
                    seen[r] = (beats, now)
                elif now - seen[r][1] > self.timeout:
                    silent = (f"has neither stepped nor finished for {self.timeout:g} s "
                              f"while this one waits for every worker to finish")
                    if self.can_lose:
                        self.mark_lost(self.store, self.prefix, r, f"was lost: it {silent}")
                        self._lose(r, f"was lost: it {silent}")
                        continue
                    raise CommTimeoutError(f"worker {r} {silent} (dead or stuck?)",
                                           op="wrap/join", seconds=self.timeout)

    def _until_all_left(self) -> None:
        """Worker 0: wait (at most `timeout`) until every worker has read the count for the
        last time; one that has not by then (it died after joining) is named in a warning."""
        end = time.monotonic() + self.timeout
        while True:
            staying = [r for r in range(self.workers) if r not in self.lost
                       and not self.store.check([self._key("left", r)])]
            if not staying:
                return
            if time.monotonic() >= end:
                warnings.warn(f"hetsync: worker(s) {staying} joined the end of the run but did "
                              f"not read it within {self.timeout:g} s (dead?); worker 0 leaves "
                              f"without them", RuntimeWarning, stacklevel=3)
                return
            time.sleep(self.POLL)


class Departures:
    """Why a worker left a wrapped run early (`hetsync.wrap`), kept in the store: one that
    raised inside `with opt:`, or whose process exits without `finish()`, leaves a line
    (`leave`); a worker whose collective then fails names them and their cause (`explain`),
    where gloo's own error names an address at best."""

    WAIT = 2.0  # seconds `explain` gives a departing worker to leave its line

    def __init__(self, store, prefix: str, rank: int, workers: int):
        self.store, self.prefix, self.rank, self.workers = store, prefix, rank, workers

    def _key(self, rank: int) -> str:
        return f"{self.prefix}/departed/{rank}"

    def leave(self, why: str) -> None:
        try:  # best effort: the store lives with worker 0's process
            self.store.set(self._key(self.rank), why[:300])
        except Exception:  # noqa: BLE001 - nothing more can be said then
            pass

    def explain(self) -> str:
        others = [r for r in range(self.workers) if r != self.rank]
        end = time.monotonic() + self.WAIT
        while True:
            try:
                said = [f"worker {r} {self.store.get(self._key(r)).decode()}" for r in others
                        if self.store.check([self._key(r)])]
            except Exception:  # noqa: BLE001 - the store itself is unreachable
                return ("the run's store is gone too: worker 0 stopped or crashed (its "
                        "process holds it)")
            if said or time.monotonic() >= end:
                return "; ".join(said) or ("no worker left a word: one was killed, or its "
                                           "machine or the network failed")
            time.sleep(0.1)
