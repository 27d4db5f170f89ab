"""Going on without a lost worker: the survivors agree on who they are through the process
group's key-value store, then make new groups of themselves alone.

For modes whose workers can lose one (ESync with its background aggregation): a collective
with a dead peer fails on the ranks connected to it at once (the connection closes) and on
the others at the channel's timeout. So that nobody waits that long:

1. a survivor whose collective failed raises the alarm: it sets ``regroup/G`` in the store
   (G counts the regroups of the run) and registers ``regroup/G/alive/RANK``;
2. every other survivor sees the alarm while it waits on its background channel
   (`Membership.alarm`, checked twice a second by `ChannelFuture.result`), and registers too;
3. each survivor waits up to `grace` seconds for every member to register, then proposes the
   new members, those that did, as ``regroup/G/members`` with an atomic compare-and-set:
   the first proposal stands and every survivor reads it (no survivor decides alone, so any
   rank, rank 0 included, may be the lost one — or die during the regroup). If every
   member registered, no peer was lost (the failure was something else): the error stands
   and the run stops;
4. each new member makes two groups of the members by themselves alone
   (``use_local_synchronization``; the dead rank takes no part): the main thread's, ranks
   ascending, and the channel's, descending (torch names such a group after its rank list:
   the two must differ).

A member lost while the groups are made (after it registered) never connects: making them
fails at the timeout, and the members regroup again (`rebuild`), without it. A rank left out
(it registered too late) stops with an error naming the regroup. Ranks keep
their numbers: a group's ranks are global ranks, so records, shards and the state server's
reports stay as they were. The lowest member leads (`leader`): it proposes, evaluates and
writes the global model (`runtime/training.py`) — rank 0 until it is lost.

The store must outlive every worker: `launch` hosts it in its own process, torchrun in its
agent (``TORCHELASTIC_USE_AGENT_STORE``); with torch's default, rank 0's process holds it and
its loss ends the run.
"""

from __future__ import annotations

import datetime
import json
import time

import torch.distributed as dist

from hetsync.comm.errors import CommError

PREFIX = "hetsync/regroup"
#: `launch` marks a worker it knows is dead here (`known_lost`)
LOST = "hetsync/lost"


def known_lost(store: dist.Store, ranks) -> list[int]:
    """The ranks of `ranks` marked dead in `store` by the launcher (which saw them exit)."""
    try:
        return [r for r in ranks if store.check([f"{LOST}/{r}"])]
    except Exception:  # noqa: BLE001 - a store out of reach marks nobody
        return []


class Membership:
    """The workers of a run that can go on without some of them, and their regroups."""

    def __init__(self, store: dist.Store, rank: int, members: list[int], *,
                 timeout: float, grace: float = 5.0):
        self.store, self.rank, self.timeout = store, rank, timeout
        self.members = sorted(members)
        self.grace = min(grace, timeout)
        self.generation = 0
        self.lost: list[int] = []

    def _key(self, *parts: object) -> str:
        return "/".join([PREFIX, str(self.generation), *map(str, parts)])

    def alarm(self) -> bool:
        """Whether a survivor has raised the alarm for the next regroup (a store that cannot
        be reached raises none: its host is gone, and the job's own deadline reports it)."""
        try:
            return self.store.check([self._key()])
        except Exception:  # noqa: BLE001 - the store's errors are not a regroup
            return False

    def regroup(self, cause: BaseException) -> list[int]:
        """Agree on the survivors (see the module docstring); returns them, the new members.
        Raises `cause` if no member was lost, CommError if this rank was left out."""
        self.store.set(self._key(), b"1")
        self.store.set(self._key("alive", self.rank), b"1")
        decided = self._key("members")
        deadline = time.monotonic() + self.grace
        while not self.store.check([decided]):
            alive = [r for r in self.members if self.store.check([self._key("alive", r)])]
            if len(alive) == len(self.members) or time.monotonic() >= deadline:
                self.store.compare_set(decided, "", json.dumps(alive))  # the first one stands
                break
            time.sleep(0.05)
        alive = json.loads(self.store.get(decided))
        if len(alive) == len(self.members):
            raise cause
        if self.rank not in alive:
            raise CommError(f"rank {self.rank} registered too late for regroup "
                            f"{self.generation} (members {alive}): it stops here",
                            op="regroup")
        self.lost += [r for r in self.members if r not in alive]
        self.members, self.generation = alive, self.generation + 1
        return alive

    @property
    def leader(self) -> int:
        """The member that proposes, evaluates and writes the global model: the lowest."""
        return self.members[0]

    def groups(self) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
        """The members' new groups, made by them alone: (main thread's, channel's); None for
        a worker left alone. Waits at most the timeout for every member to connect."""
        if len(self.members) == 1:
            return None, None
        wait = datetime.timedelta(seconds=self.timeout)
        return (dist.new_group(self.members, timeout=wait, use_local_synchronization=True),
                dist.new_group(self.members[::-1], timeout=wait,
                               use_local_synchronization=True, sort_ranks=False))

    def rebuild(self, cause: BaseException) -> tuple[list[int], tuple]:
        """`regroup`, then `groups`; if a member is lost while they are made, regroup again
        without it. Returns the members and their groups; raises as `regroup` does."""
        while True:
            members = self.regroup(cause)
            try:
                return members, self.groups()
            except Exception as exc:  # noqa: BLE001 - gloo's own error, or its timeout
                cause = CommError(f"regroup {self.generation - 1}: the groups of members "
                                  f"{members} were not made: {exc}", op="regroup")
