"""A lost worker of an asynchronous mode back in the running job: a link of its own to the
parameter server.

The server talks to its workers over the default process group, which has no place for a
lost worker's new process (the others hold a connection to the dead one and never connect to
another). So the new process (`hetsync worker --join`, which `launch` starts in place of a
lost worker) and the server make a group of their two ranks alone, through the run's
key-value store (which outlives every worker: `launch` hosts it, torchrun its agent):

1. the new process asks (`ask`): it sets ``hetsync/ps-join/RANK`` to an id of its own;
2. the server, between requests (`ParameterServer`'s `joins`, every
   `ParameterServer.JOIN_POLL_S` at most), reads that key for each worker it has lost
   (`Joins`); for an id it has not seen, it answers ``hetsync/ps-join/RANK/ID`` and makes
   its end of the group under that id;
3. the new process, seeing the answer, makes its end; both must within `MAKING_S` (one
   attempt per id: a process that missed it fails, and its successor asks with an id of its
   own). It then withdraws `launch`'s mark of the dead process (``hetsync/lost/RANK``: the
   others count it alive again) and the server serves it on the link, its requests numbered
   afresh.

The worker then takes the server's model (its mode's `setup`: a pull) and goes on where its
own records end (`TrainingLoop._enter_server`). Nothing else of the run changes: the
server's rule and the other workers never see the join. If the run stops first, the new
process leaves without training; if the server gives no answer within the wait, it fails.
"""

from __future__ import annotations

import datetime
import secrets
import time
from typing import Callable, Iterable

import torch.distributed as dist

from hetsync.comm.errors import CommError
from hetsync.comm.topology import GroupView
from hetsync.runtime.membership import LOST, shared

#: a lost rank's new process asks here (nobody withdraws it: the server tries each id once)
ASK = "hetsync/ps-join"
#: how long making a link's group waits for its other end (both make it at once)
MAKING_S = 5.0


def _make(store: dist.Store, worker: int, server: int, ident: str, me: int) -> GroupView:
    """The two-rank group of `worker` (group rank 0) and `server` (1) under `ident`; `me`:
    this process's group rank."""
    pg = dist.ProcessGroupGloo(dist.PrefixStore(f"{ASK}/{worker}/{ident}/group", store), me,
                               2, datetime.timedelta(seconds=MAKING_S))
    return GroupView(pg, me, 2, (worker, server))


def ask(store: dist.Store, rank: int, server: int, *, wait: float,
        stopped: Callable[[], bool]) -> GroupView | None:
    """This process is lost rank `rank`'s new one: ask the parameter server (global rank
    `server`) for a link and make it; None if `stopped()` first, CommError if the server
    gives no answer within `wait` seconds."""
    store = shared(store)
    ident = secrets.token_hex(8)
    answer = f"{ASK}/{rank}/{ident}"
    store.set(f"{ASK}/{rank}", ident)
    deadline = time.monotonic() + wait
    while not store.check([answer]):
        if stopped():
            return None
        if time.monotonic() > deadline:
            raise CommError(f"join: the parameter server (rank {server}) did not answer rank "
                            f"{rank}'s request within {wait:g} s", op="join", peer=server)
        time.sleep(0.05)
    try:
        view = _make(store, rank, server, ident, me=0)
    except RuntimeError as err:  # (gloo's) the server did not make its end in time
        raise CommError(f"join: the link to the parameter server (rank {server}): {err}",
                        op="join", peer=server) from err
    store.delete_key(f"{LOST}/{rank}")  # alive again (the others' lead, the server's linger)
    return view


class Joins:
    """The server's side: `joins(lost)` makes a link for each worker of `lost` whose new
    process asked since, and returns them as (worker, the link's view)."""

    def __init__(self, store: dist.Store, server: int):
        self.store, self.server = shared(store), server
        self._seen: dict[int, str] = {}  # worker -> the last id it asked with

    def __call__(self, lost: Iterable[int]) -> list[tuple[int, GroupView]]:
        links = []
        for worker in lost:
            try:
                if not self.store.check([f"{ASK}/{worker}"]):
                    continue
                ident = self.store.get(f"{ASK}/{worker}").decode()
                if self._seen.get(worker) == ident:
                    continue
                self._seen[worker] = ident
                self.store.set(f"{ASK}/{worker}/{ident}", "1")
                links.append((worker, _make(self.store, worker, self.server, ident, me=1)))
                # alive again from here (its process withdraws the mark too, a moment later:
                # a goodbye in between would have the server drop it)
                self.store.delete_key(f"{LOST}/{worker}")
            except RuntimeError:  # the store out of reach, or the asker gone since: not now
                continue
        return links
