"""A worker's persistent background channel: one thread, its own process group, futures.

Modes that communicate while the worker computes (ESync's background aggregation, eager-SGD's
partial rounds) and the training loop's agreement in those modes hand their collectives to the
worker's :class:`Channel`:

1. one daemon thread per worker runs the jobs in the order they were submitted; every rank
   submits the same jobs in the same order, so collectives match across ranks;
2. the jobs run on the channel's own process group (made with its own ``new_group``), so a
   background collective never cross-matches a message of the main thread's group, whatever
   the two do at the same moment;
3. :meth:`Channel.submit` returns a :class:`ChannelFuture` the caller owns; its
   :meth:`~ChannelFuture.result` waits at most until the job's deadline (the channel's timeout
   for the job itself and for each job queued before it), then raises
   :class:`~hetsync.comm.errors.CommTimeoutError` naming the job, instead of hanging;
4. a job that fails (a dead peer: every hetsync collective is bounded by its timeout) breaks
   the channel: the jobs after it fail at once with the first error, since their group can no
   longer be trusted (gloo closes a pair whose transfer timed out).

The thread is a daemon, so a worker that fails exits at once instead of waiting for its peers'
timeout.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import torch.distributed as dist

from .errors import CommError, CommTimeoutError
from .p2p import leave_behind
from .timeouts import resolve_timeout

_STOP = object()
_LOCAL_GROUPS: dict[tuple[int, ...], dist.ProcessGroup] = {}


def local_group(ranks: list[int]) -> dist.ProcessGroup:
    """A group of `ranks` made by them alone (``use_local_synchronization``), once per process
    and rank list: torch names such a group by its rank list, so making it twice fails. One
    user of it at a time (e.g. one wrapped optimizer at a time)."""
    key = tuple(ranks)
    if key not in _LOCAL_GROUPS:
        _LOCAL_GROUPS[key] = dist.new_group(list(ranks), use_local_synchronization=True,
                                            sort_ranks=False)
    return _LOCAL_GROUPS[key]


class PeerLost(CommError):
    """A wait on the channel given up because a peer raised the alarm: a worker was lost
    (`hetsync.runtime.membership`)."""


class ChannelFuture:
    """The result of one channel job, with a deadline."""

    #: seconds between looks at the alarm while waiting
    ALARM_EVERY = 0.5

    def __init__(self, what: str, deadline: float, timeout: float,
                 alarm: Callable[[], bool] | None = None):
        self.what, self.deadline, self.timeout = what, deadline, timeout
        self.alarm = alarm
        self._future: Future = Future()

    def done(self) -> bool:
        return self._future.done()

    def result(self, within: float | None = None) -> Any:
        """The job's value; its exception if it failed; CommTimeoutError past the deadline
        (or `within` seconds from now, whichever comes first); PeerLost as soon as the
        channel's alarm goes off while waiting."""
        end = self.deadline if within is None else min(self.deadline, time.monotonic() + within)
        while True:
            left = end - time.monotonic()
            try:
                return self._future.result(timeout=max(min(left, self.ALARM_EVERY), 0.0)
                                           if self.alarm is not None else max(left, 0.0))
            except TimeoutError:
                if self.alarm is not None and left > self.ALARM_EVERY:
                    if self.alarm():
                        raise PeerLost(f"{self.what}: given up, a peer was lost",
                                       op=self.what) from None
                    continue
                raise CommTimeoutError(
                    f"{self.what}: not done in time ({self.timeout:g} s per job on the "
                    f"background channel; a peer dead or silent?)", op=self.what,
                    seconds=self.timeout) from None


class Channel:
    """One background thread with its own process group (see the module docstring).

    Args:
        group: the channel's own process group (``None``: the default group, for one worker
            or tests that have nothing else on it).
        timeout: seconds each job may take (its collectives are bounded by it too).
    """

    def __init__(self, group: dist.ProcessGroup | None, *, timeout: float | None = None,
                 name: str = "hetsync-channel"):
        self.group = group
        self.timeout = resolve_timeout(timeout)
        #: a check that a peer was lost, for the waits on this channel's jobs (None: none)
        self.alarm: Callable[[], bool] | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def for_ranks(cls, ranks: list[int], *, timeout: float | None = None) -> "Channel":
        """A channel over a new group of ``ranks`` (global ranks); only they call this.

        The group is made with ``use_local_synchronization``, which names a group by a hash
        of its rank list: the list is given in descending order (``sort_ranks=False``), so
        that it never takes the name, and the store keys, of a group of the same ranks made
        the same way in ascending order (the workers' own group in ``hetsync.wrap``).
        """
        group = local_group(sorted(ranks, reverse=True)) \
            if dist.is_initialized() and len(ranks) > 1 else None
        return cls(group, timeout=timeout)

    def submit(self, fn: Callable[[dist.ProcessGroup | None], Any], what: str, *,
               long_running: bool = False) -> ChannelFuture:
        """Run ``fn(group)`` on the channel's thread after the jobs already submitted.
        A `long_running` job (one that lasts the whole run, bounding its own waits) has no
        deadline: its caller waits with ``result(within=...)``."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{what}: the channel is closed")
            self._queued += 1
            ahead = self._queued
        deadline = float("inf") if long_running else time.monotonic() + ahead * self.timeout
        job = ChannelFuture(what, deadline, self.timeout, self._alarm_went_off)
        self._jobs.put((fn, job))
        return job

    def _alarm_went_off(self) -> bool:
        """The alarm as it is when a wait looks (it may be set after a job was submitted)."""
        return self.alarm is not None and self.alarm()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            fn, job = item
            try:
                if self._failure is not None:
                    raise CommError(f"{job.what}: the background channel broke earlier: "
                                    f"{self._failure}", op=job.what)
                job._future.set_result(fn(self.group))
            except BaseException as exc:  # noqa: BLE001 - raised again by job.result()
                if self._failure is None:
                    self._failure = exc
                job._future.set_exception(exc)
            finally:
                with self._lock:
                    self._queued -= 1

    def close(self, wait: bool = True) -> None:
        """Stop the thread once the jobs already submitted are done (bounded by their
        deadlines). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ahead = self._queued
        self._jobs.put(_STOP)
        if wait:
            self._thread.join(timeout=(ahead + 1) * self.timeout)
        if self._thread.is_alive():
            leave_behind(self._thread)
