"""Going on without a lost worker: the survivors agree on who they are through the process
group's key-value store, then make new groups of themselves alone.

For modes whose workers can lose one (`sync`, SelSync, ESync and DiLoCo in the background,
eager-SGD): a collective with a dead peer fails on the ranks connected to it at once (the
connection closes) and on the others, waiting on a live peer, at the timeout (gloo fails a
wait only on the connection that closed: `results/sync-going-on-probe.md`). So that nobody
waits that long:

1. a survivor whose collective failed raises the alarm: it sets ``regroup/G`` in the store
   (G counts the regroups of the run) and registers ``regroup/G/alive/RANK``;
2. every other survivor sees the alarm while it waits on its background channel or on a
   main-thread collective (`Membership.alarm`, checked twice a second by
   `ChannelFuture.result`; `CommContext.hear`), and registers too;
3. each survivor waits up to `grace` seconds for every member to register (no longer once
   every member that has not is one `launch` saw exit: ``lost/RANK``, set at once), then
   proposes the new members, those that did, as ``regroup/G/members`` with an atomic
   compare-and-set: the first proposal stands and every survivor reads it (no survivor
   decides alone, so any rank, rank 0 included, may be the lost one — or die during the
   regroup). If every member registered, no peer was lost (the failure was something
   else): the error stands and the run stops;
4. each new member makes two groups of the members by themselves alone
   (``use_local_synchronization``; the dead rank takes no part): the main thread's, ranks
   ascending, and the channel's, descending (torch names such a group after its rank list:
   the two must differ).

A member lost while the groups are made (after it registered) never connects: making them
fails within `MAKING_S` (not the timeout: every live member is making them at the same
time) — or five times it, where the lost member had published its address and a survivor
waits for its connection (gloo's retries) — and the members regroup again (`rebuild`),
without it. A rank left out (it registered
too late) stops with an error naming the regroup. Ranks keep their numbers: a group's ranks
are global ranks, so records, shards and the reports to a mode's service stay as they were. One
member leads (`leader`): it proposes, evaluates and writes the global model
(`runtime/training.py`) — rank 0 until it is lost, then the lowest survivor, which keeps the
lead while it lives (a rank that joins does not take it back while the leader lives).

A lost rank may come back and join the running job (torchft's and elastic Horovod's "join";
`hetsync worker --join`, which `launch` starts in place of a lost worker), and so may a spare
(`--spare-workers`: a rank of the world that did not start with the others, `absent`):

1. the new process asks (`enter`): it removes `launch`'s mark of the process that died and
   sets ``join/RANK`` to an id of its own;
2. at a round's end the leader sees the lost ranks that asked (`waiting`; not one `launch`
   has marked dead since) and offers them a place (`offer`): it proposes the next
   generation's members, lost ranks and joiners in ``regroup/G/members`` (the
   compare-and-set of a regroup: if a survivor's regroup proposed first, the offer is not
   made; if the offer came first, a regroup of that generation — a member was lost before
   every member admitted — admits the joiners as agreed, then regroups among those
   members) and answers each joiner's id with the generation, the members and how many
   groups each member has made; the round's agreement tells every member to admit them
   (`admit`) at the same point of its collectives;
3. each member, and the joiner (`enter`), make the new groups; the joiner, which has made
   none, first makes groups of itself alone until it has made as many as the members: torch
   names a group made by its members alone after its ranks and the number of groups its
   process has made (`distributed_c10d._hash_ranks_to_str`), and both must agree;
4. the mode's `admit` gives the joiner the leader's global state (`runtime/training.py`).

The joiner's process group is torch's default one made lazily (``TORCH_GLOO_LAZY_INIT``): the
members' default group holds a connection to the lost process and never connects to the new
one, so the joiner uses only the groups made with it. If the run ends first (`close`), the
joiner leaves without training.

Who leads has one rule (`successor`): rank 0, then once the leader is lost the lowest
survivor, which keeps the lead while it lives. A regroup applies it to the members it agreed
on; an asynchronous run, which has no membership to agree on, applies it to the ranks
`launch` has not marked lost and names its leader in the store (`StoreLead`). A checkpoint
does not apply it again: its leader is the rank whose file holds its global model
(`checkpoint.leader`).

The store must outlive every worker: `launch` hosts it in its own process, torchrun in its
agent (``TORCHELASTIC_USE_AGENT_STORE``); with torch's default, rank 0's process holds it and
its loss ends the run.
"""

from __future__ import annotations

import datetime
import json
import secrets
import time

import torch.distributed as dist

from hetsync.comm.errors import CommError, CommTimeoutError

PREFIX = "hetsync/regroup"
#: `launch` marks a worker it knows is dead here (`known_lost`); an asynchronous run's rank 0
#: marks its spares with `SPARE` until each links (`marked_spare`)
LOST = "hetsync/lost"
SPARE = "spare"
#: a lost rank's new process asks to join here (`Membership.enter`)
JOIN = "hetsync/join"
#: the leader marks the end of the run here: nobody is admitted after it
DONE = "hetsync/done"
#: what `compare_set` returns for a key that is not there (never a joiner's id, hex)
_GONE = "-"


def _group_count() -> int:
    """How many process groups this process has made (torch's own count, which names them)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_names)


def shared(store: dist.Store) -> dist.Store:
    """`store` without torch's prefixes (a process group's store prefixes every key with
    its group's name): the keys that `launch` sets and reads in its own store."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def known_lost(store: dist.Store, ranks) -> list[int]:
    """The ranks of `ranks` marked dead in `store` by the launcher (which saw them exit)."""
    try:
        return [r for r in ranks if shared(store).check([f"{LOST}/{r}"])]
    except Exception:  # noqa: BLE001 - a store out of reach marks nobody
        return []


def local_groups(ranks: list[int], making: float, timeout: float) -> tuple:
    """Two groups of `ranks` made by them alone (`use_local_synchronization`): the main
    thread's, in the order given (its first is group rank 0, which `broadcast` copies from),
    and the channel's, reversed (torch names such a group after its rank list: the two must
    differ). Each waits `making` seconds for the others to connect, then `timeout` seconds
    in each collective."""
    groups = tuple(dist.new_group(order, timeout=datetime.timedelta(seconds=making),
                                  use_local_synchronization=True, sort_ranks=False)
                   for order in (ranks, ranks[::-1]))
    for group in groups:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout), group)
    return groups


def successor(leader: int, alive) -> int:
    """Who leads among the ranks `alive`: `leader` while it lives, else the lowest of them
    (rank 0 leads first; a rank that joins again does not take the lead back while the
    leader lives)."""
    return leader if leader in alive else min(alive)


class StoreLead:
    """An asynchronous run's leader (each worker talks to the parameter server alone: no
    regroup to agree on it). Rank 0 leads until `launch` marks it dead in the store; then
    the `successor` among the ranks not marked dead takes the lead by a compare-and-set of
    `KEY`, so that one does, however many saw the loss (`follow`). A lost rank's new process
    leads on where the store still names its rank (`reclaim`)."""

    KEY = "hetsync/lead"
    #: how often `follow` asks the store (three queries while the leader lives)
    CHECK_S = 0.5

    def __init__(self, store: dist.Store, rank: int, ranks, joining: bool):
        self.store, self.rank, self.ranks = store, rank, ranks
        #: the leader as this worker last saw it (a joiner's: none until it has entered)
        self.leader = -1 if joining else 0
        self._next_check = 0.0

    def _named(self) -> tuple[int, str]:
        """The leader the store names (else rank 0), and the value that names it ("": none)."""
        if self.store.check([self.KEY]):
            value = self.store.get(self.KEY).decode()
            return int(value.split(":")[0]), value
        return 0, ""

    def _take(self, named: str) -> None:
        """Take the lead where the store still holds `named`. Each take writes a value of its
        own (RANK:TAKE), so a take made on an older value fails: a rejoiner's `reclaim`
        and a successor's `follow` that both read its rank cannot both lead."""
        value = self.store.compare_set(self.KEY, named, f"{self.rank}:{time.time_ns()}")
        self.leader = int(value.decode().split(":")[0])

    def follow(self) -> int | None:
        """At most every `CHECK_S`: the leader as the store has it, and the lead taken where
        it was lost and this rank is its successor. Returns the lost leader's rank when this
        rank has just taken the lead, else None."""
        now = time.monotonic()
        if self.leader == self.rank or now < self._next_check:
            return None
        self._next_check = now + self.CHECK_S
        leader, named = self._named()
        self.leader = leader
        if not known_lost(self.store, [leader]):
            return None
        alive = set(self.ranks) - set(known_lost(self.store, self.ranks))
        if successor(leader, alive) != self.rank:
            return None
        self._take(named)
        return leader if self.leader == self.rank else None

    def reclaim(self) -> bool:
        """A lost rank's new process: where the store still names its rank the leader (its old
        process led, and nobody has taken over), it leads on, unless another rank takes the
        lead first (the same compare-and-set). Whether it leads."""
        leader, named = self._named()
        self.leader = leader
        if leader == self.rank:
            self._take(named)
        return self.leader == self.rank


def marked_spare(store: dist.Store, ranks) -> list[int]:
    """The ranks of `ranks` still marked as spares that have not joined (a subset of
    `known_lost`'s)."""
    try:
        return [r for r in known_lost(store, ranks)
                if shared(store).get(f"{LOST}/{r}") == SPARE.encode()]
    except Exception:  # noqa: BLE001 - a store out of reach names none
        return []


class Roster:
    """Who leads, who is lost and who has not joined yet: one answer for the training loop
    and `hetsync.wrap` alike, from whatever keeps it —

    - a `Membership` (the workers regroup): what they agreed on;
    - else a `store` (an asynchronous run: no membership to agree on): `StoreLead`, and
      `launch`'s marks of the dead and of the spares;
    - else rank 0 leads and nobody is lost (one worker, or a mode that stops at its first
      loss);

    and, with any of them, `departed`: workers a stop went on without (`hetsync.wrap`'s
    parameter-server modes, `control.StoreJoin`)."""

    def __init__(self, rank: int, ranks, *, membership: "Membership | None" = None,
                 store: dist.Store | None = None, joining: bool = False,
                 departed=lambda: ()):
        self.rank, self.ranks, self.membership = rank, ranks, membership
        self.store = store if membership is None else None
        self.store_lead = (StoreLead(self.store, rank, ranks, joining)
                           if self.store is not None else None)
        self._departed = departed

    @property
    def leader(self) -> int:
        """Who proposes, evaluates and writes the run's own files: rank 0, or after it was
        lost its `successor`."""
        if self.membership is not None:
            return self.membership.leader
        return self.store_lead.leader if self.store_lead is not None else 0

    @property
    def leads(self) -> bool:
        return self.rank == self.leader

    def lost(self) -> list[int]:
        """The workers the run went on without (not the spares that have not joined), in
        the membership's order of loss where it has one."""
        if self.membership is not None:
            lost = list(self.membership.lost)
        elif self.store is not None:
            absent = self.absent()
            lost = [r for r in known_lost(self.store, self.ranks) if r not in absent]
        else:
            lost = []
        return lost + [r for r in sorted(self._departed()) if r not in lost]

    def absent(self) -> list[int]:
        """The spares (`--spare-workers`) that have not joined."""
        if self.membership is not None:
            return list(self.membership.absent)
        return marked_spare(self.store, self.ranks) if self.store is not None else []

    def follow(self) -> int | None:
        """An asynchronous run: `StoreLead.follow` (the lost leader's rank where this worker
        has just taken the lead, else None)."""
        return self.store_lead.follow() if self.store_lead is not None else None

    def reclaim(self) -> bool:
        """An asynchronous run's joiner: `StoreLead.reclaim`."""
        return self.store_lead is not None and self.store_lead.reclaim()


class Membership:
    """The workers of a run that can go on without some of them, and their regroups."""

    #: how long making the new groups waits for every member (at least; `groups`)
    MAKING_S = 5.0

    def __init__(self, store: dist.Store, rank: int, members: list[int], *,
                 timeout: float, grace: float = 5.0, absent: list[int] = ()):
        self.store, self.rank, self.timeout = store, rank, timeout
        #: where joiners ask and the end is marked: `launch` withdraws a dead joiner's request
        self.shared = shared(store)
        self.members = sorted(members)
        self.grace = min(grace, timeout)
        self.generation = 0
        self.lost: list[int] = []
        #: the spares (`--spare-workers`) that have not joined yet: they ask as a lost rank
        self.absent: list[int] = sorted(absent)
        #: the ranks that joined the running job, in the order they did
        self.joined: list[int] = []
        #: proposes, evaluates, writes the global model: rank 0, then the lowest survivor
        self.leader = self.members[0]

    def _key(self, *parts: object) -> str:
        return "/".join([PREFIX, str(self.generation), *map(str, parts)])

    def alarm(self) -> bool:
        """Whether a survivor has raised the alarm for the next regroup (a store that cannot
        be reached raises none: its host is gone, and the job's own deadline reports it)."""
        try:
            return self.store.check([self._key()])
        except Exception:  # noqa: BLE001 - the store's errors are not a regroup
            return False

    def regroup(self, cause: BaseException, grace: float | None = None) -> list[int]:
        """Agree on the survivors (see the module docstring); returns them, the new members.
        `grace`: how long to wait for a member that has not registered (`self.grace`).
        Raises `cause` if no member was lost, CommError if this rank was left out."""
        self.store.set(self._key(), b"1")
        self.store.set(self._key("alive", self.rank), b"1")
        decided = self._key("members")
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while not self.store.check([decided]):
            alive = [r for r in self.members if self.store.check([self._key("alive", r)])]
            missing = [r for r in self.members if r not in alive]
            # (a member `launch` saw exit is not waited for: the grace is for a slow one)
            if (len(known_lost(self.shared, missing)) == len(missing)
                    or time.monotonic() >= deadline):
                self.store.compare_set(decided, "", json.dumps(alive))  # the first one stands
                break
            time.sleep(0.05)
        alive = json.loads(self.store.get(decided))
        if any(r not in self.members for r in alive):
            # the leader's offer (`offer`) proposed first: its admission is agreed, so this
            # member admits the joiners, then regroups among the members that makes — waiting
            # out a member that admitted and is still making the groups with the lost one
            # (up to five times `MAKING_S`: gloo's retries)
            self.admit()
            return self.regroup(cause, grace=self.grace + 5 * self.MAKING_S)
        if len(alive) == len(self.members):
            raise cause
        if self.rank not in alive:
            raise CommError(f"rank {self.rank} registered too late for regroup "
                            f"{self.generation} (members {alive}): it stops here",
                            op="regroup")
        self.lost += [r for r in self.members if r not in alive]
        self.members, self.generation = alive, self.generation + 1
        self.leader = successor(self.leader, alive)
        return alive

    def groups(self, making: float | None = None
               ) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
        """The members' new groups, made by them alone: (main thread's, channel's), the
        leader first in the main one (its group rank 0, which `broadcast` copies from); None
        for a worker left alone. Waits at most `MAKING_S` (or the timeout, if shorter) for
        every member to connect: each live one is making them at the same time, so one that
        does not has died since it registered; the groups' collectives then wait up to the
        timeout, as every other's. `making`: another wait, in seconds (at a run's start, where
        the members may start seconds apart)."""
        if len(self.members) == 1:
            return None, None
        return local_groups([self.leader] + [r for r in self.members if r != self.leader],
                            making or min(self.timeout, max(self.grace, self.MAKING_S)),
                            self.timeout)

    # ------------------------------------------------------------------ joining
    def waiting(self) -> list[int]:
        """The lost ranks and spares that asked to join (the leader looks at a round's end),
        less those `launch` has seen exit since they asked (making groups with one would
        wait for it)."""
        try:
            return [r for r in self.lost + self.absent if self.shared.check([f"{JOIN}/{r}"])
                    and not self.shared.check([f"{LOST}/{r}"])]
        except Exception:  # noqa: BLE001 - a store out of reach admits nobody
            return []

    def offer(self, joining: list[int]) -> bool:
        """Step 2 (the leader): propose the next members with `joining` and answer each
        joiner; False if a regroup's proposal came first (the offer is not made)."""
        members = sorted(self.members + joining)
        if self.store.compare_set(self._key("members"), "", json.dumps(members)) != \
                json.dumps(members).encode():
            return False
        answer = json.dumps({"generation": self.generation, "members": members,
                             "leader": self.leader, "groups": _group_count(),
                             "lost": [r for r in self.lost if r not in joining],
                             "absent": [r for r in self.absent if r not in joining],
                             "joined": self.joined + joining})
        for rank in joining:
            # (a non-blocking get: `launch` withdraws the request of a joiner that died since
            # `waiting`; the members then fail to make groups with it, and regroup)
            attempt = self.shared.compare_set(f"{JOIN}/{rank}", _GONE, _GONE).decode()
            if attempt != _GONE:
                self.shared.delete_key(f"{JOIN}/{rank}")
                self.shared.set(f"{JOIN}/{rank}/{attempt}", answer)
        return True

    def admit(self) -> list[int]:
        """Step 3 (every member, at the agreed round): the offered members become this
        generation's; returns the ranks that join."""
        members = json.loads(self.store.get(self._key("members")))
        joining = [r for r in members if r not in self.members]
        self.lost = [r for r in self.lost if r not in joining]
        self.absent = [r for r in self.absent if r not in joining]
        self.joined += [r for r in joining if r not in self.joined]
        self.members, self.generation = members, self.generation + 1
        return joining

    def enter(self, wait: float) -> bool:
        """Steps 1 and 3 (the joiner): ask, wait up to `wait` seconds for the leader's answer;
        take its members and match the members' count of groups. False if the run ended
        first; CommTimeoutError if no answer came."""
        self.members, self.leader = [], None  # (none of them until it is admitted)
        attempt = secrets.token_hex(8)
        # (`launch`'s mark was of the process that died; if this one dies, it marks it again)
        self.shared.delete_key(f"{LOST}/{self.rank}")
        self.shared.set(f"{JOIN}/{self.rank}", attempt)
        key = f"{JOIN}/{self.rank}/{attempt}"
        deadline = time.monotonic() + wait
        while not self.shared.check([key]):
            if self.shared.check([DONE]):
                return False
            if time.monotonic() >= deadline:
                raise CommTimeoutError(
                    f"rank {self.rank} asked to join but was not admitted within {wait:.0f} s "
                    f"(a lost rank is admitted at the round's end after the others have "
                    f"regrouped without it)", op="join", seconds=wait)
            time.sleep(0.05)
        answer = json.loads(self.shared.get(key))
        self.shared.delete_key(key)
        self.members, self.leader = answer["members"], answer["leader"]
        self.lost, self.generation = answer["lost"], answer["generation"] + 1
        self.absent = answer["absent"]
        self.joined = answer["joined"]
        while _group_count() < answer["groups"]:  # (step 3: torch's names must agree)
            dist.new_group([self.rank], use_local_synchronization=True)
        if _group_count() != answer["groups"]:
            raise CommError(f"rank {self.rank} cannot join: it has made {_group_count()} "
                            f"process groups, the members {answer['groups']}", op="join")
        return True

    def close(self) -> None:
        """The leader, at the end of the run: nobody is admitted after it."""
        try:
            self.shared.set(DONE, "1")
        except Exception:  # noqa: BLE001 - a store out of reach has nobody waiting on it
            pass

    def go_on(self, mode, cause: BaseException, then=lambda: None) -> list[int]:
        """The survivors of a lost member go on (the training loop and `hetsync.wrap`
        alike): `rebuild`, `mode.comm` on the new groups, the leader's global state
        (`mode.rejoin`), then `then()` (the caller's own state from the leader); a member
        lost meanwhile is regrouped around in turn. Returns the members; raises as
        `regroup` does."""
        while True:
            members, groups = self.rebuild(cause)
            self.use(mode.comm, groups)
            try:
                mode.rejoin()
                then()
                return members
            except RuntimeError as lost:  # (gloo's, or a CommError): another lost meanwhile
                cause = CommError(f"regroup {self.generation}: a member was lost in the "
                                  f"leader's broadcast: {lost}", op="regroup")

    def use(self, comm, groups: tuple) -> None:
        """`comm` goes on with the members on their new `groups` (its waits hear the next
        alarm: `CommContext.hear`)."""
        comm.regroup(self.members, *groups, generation=self.generation)
        comm.hear(self.alarm)

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
