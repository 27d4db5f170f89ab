"""Which worker draws which shard of the training data in a run that goes on without some of
its workers (`runtime/membership.py`): a lost worker's shard — or a spare's that has not
joined — goes on being drawn by one of the members, so that every sample is still drawn once
per epoch (docs/design.md, "The data ledger").

1. `holder(shard, members)`: the shard's own worker while it is a member, else the members'
   (shard mod k)-th, k members in rank order: every worker computes the same from the
   members alone;
2. at the start and at every round's record, each worker publishes in the run's store where
   its draws of each shard it holds have reached (`publish`). A mode whose round every
   member completes or none does (`Mode.rounds_all_or_none`: sync's one sum) publishes before
   the round's sum instead, naming the round and where each shard's draws of it began: a
   worker stopped after the sum, before its record, has trained that round's batches,
   which its last record does not say;
3. after a regroup, which drops the round in progress everywhere, a worker draws each shard it
   holds again from where its last recorded round ended: its own and those it held before
   from its own count, one it holds now from the position its last holder published
   (`published`) -- where that names a round, after it if the survivors completed it, else
   from its start. Such a worker also publishes at its record: where the last publish still
   names a completed round, its holder was lost between the round's sum and its record, and
   the new holder's next record names that round's draws (`unrecorded`) with its own;
4. at an admission nothing is dropped: a member that hands a shard on publishes where its
   draws are now, under the new generation (`hand_over`), and the shard's new holder — the
   worker that joins, for its own — waits for it (`taken_over`; a regroup's alarm ends the
   wait);
5. a worker draws its shards in turn, one batch of each (`HeldShards.draw`; where the
   batches are re-planned, its worker's batch of draws of a sample, `draw_batch` and
   `runtime/replan.py`), each with its own worker's sampler (seed and batch size), and
   records another's apart (a record's `held`, `telemetry/ledger.py`);
6. an asynchronous mode has no membership to agree on (each worker talks to the parameter
   server alone): its members are the ranks `launch` has not marked lost, and each shard's
   drawer is named in the store (`DRAWER`). At most twice a second, after a record, a
   worker lets go of the shards another member holds now (`let_go`: their own worker is
   back) and `claim`s those it holds — one that nobody draws, or whose drawer is lost — from
   where they were last published. A drawer is named by rank and process (`drawer_of`), so
   that a lost process's claims are told apart from its successor's. A worker that joins
   lets go of what its lost process held, then waits until its own shard's holder has let
   go (`claim_own`).

Where hetsync departs from a re-partition: the shards stay whole, so a lost slow device's
small batches are drawn as they were. `hetsync.wrap`'s batch sampler (`shard_batches.py`)
draws with the same `HeldShards`, steps 1-3 and 5.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from hetsync.comm.errors import CommError, CommTimeoutError

#: where a shard's draws have reached, as its holder last published: ``KEY/SHARD``
KEY = "hetsync/shard"
#: an asynchronous run's drawer of a shard (step 6): ``DRAWER/SHARD`` = `drawer_of`, or empty
DRAWER = "hetsync/drawer"


def publishes_before_sum(mode, membership) -> bool:
    """Step 2's predicate: whether a worker of `mode` publishes where its shards stand as it
    draws, before the round's sum, not after its record — where a membership goes on
    without a lost worker (`membership`: not None) and every member completes a round or
    none does (`Mode.rounds_all_or_none`)."""
    return membership is not None and mode.rounds_all_or_none


def holder(shard: int, members: list[int]) -> int:
    """The member that draws `shard`: its own worker, else the members' (shard mod k)-th."""
    members = sorted(members)
    return shard if shard in members else members[shard % len(members)]


def held_by(rank: int, members: list[int], shards) -> list[int]:
    """The shards of `shards` that `rank` draws while `members` are the run's members."""
    return [s for s in shards if holder(s, members) == rank]


@dataclass
class Shard:
    """One shard's sampler and where its draws are: (epoch, batches of it taken)."""

    sampler: Any
    position: tuple[int, int] = (0, 0)
    #: where the round's draws of it began (a regroup draws them again from here)
    round_start: tuple[int, int] = (0, 0)
    draws: Iterator | None = None


class HeldShards:
    """The shards one worker draws: its own (`own`), and those it holds for others, each
    with a sampler `make(shard)` builds (the others' seed and batch size)."""

    def __init__(self, own: int, sampler, make: Callable[[int], Any] | None = None):
        self.own, self.make = own, make
        self.shards = {own: Shard(sampler)}
        #: each shard's batches per epoch, of every shard held so far (for the records)
        self.epoch_batches = {own: batches_per_epoch(sampler)}
        self._turn = 0
        #: what one draw is, for the ledger: a batch, or a re-planning run's sample
        self.unit = "batch"

    def start_at(self, shard: int, epoch: int, batch: int) -> None:
        """Draw `shard` from batch `batch` of epoch `epoch` on."""
        s = self.shards[shard]
        s.sampler.resume_at(epoch, batch)
        s.position = s.round_start = (epoch, batch)
        s.draws = None

    def draw(self, before: int | None = None) -> tuple[int, int, int, Any] | None:
        """The next batch, of each shard in turn: (shard, epoch, batch number, indices).
        `before`: only of the epochs before it (None once every shard held has reached it;
        `hetsync.wrap`'s passes, one an epoch)."""
        shard = self._next(before)
        if shard is None:
            return None
        epoch, number, indices = self._take(shard)
        return shard, epoch, number, indices

    def draw_batch(self, draws: Callable[[int], int]
                   ) -> tuple[int, list[tuple[int, int]], np.ndarray]:
        """The next batch, of each shard in turn, made of `draws(shard)` of its sampler's
        draws (a re-planning run's, a sample each: `runtime/replan.py`): (shard, the
        (epoch, number) of each draw, the indices)."""
        shard = self._next(None)
        taken = [self._take(shard) for _ in range(draws(shard))]
        return (shard, [(epoch, number) for epoch, number, _ in taken],
                np.concatenate([indices for _, _, indices in taken]))

    def _next(self, before: int | None) -> int | None:
        order = [s for s in sorted(self.shards) if before is None or self.at(s) < (before, 0)]
        if not order:
            return None
        self._turn += 1
        return order[(self._turn - 1) % len(order)]

    def _take(self, shard: int) -> tuple[int, int, Any]:
        s = self.shards[shard]
        if s.draws is None:
            s.draws = iter(s.sampler)  # (endless: the shard's epochs one after another)
        epoch, indices = next(s.draws)
        s.position = (epoch, s.position[1] + 1) if epoch == s.position[0] else (epoch, 1)
        return epoch, s.position[1] - 1, indices

    def at(self, shard: int) -> tuple[int, int]:
        """Where `shard`'s draws are, an epoch's end written as the next one's start."""
        epoch, batch = self.shards[shard].position
        batches = self.epoch_batches.get(shard)
        return (epoch + 1, 0) if batches is not None and batch >= batches else (epoch, batch)

    def record_fields(self, drawn: list, held: dict) -> dict[str, Any]:
        """A round record's ledger fields beside its own draws (`drawn`): the own shard's
        batches per epoch, and the draws of the shards held for others (`held`), each with
        its batches per epoch (`telemetry/ledger.py`)."""
        fields: dict[str, Any] = {"ledger_unit": self.unit} if self.unit != "batch" else {}
        if drawn and self.epoch_batches[self.own] is not None:
            fields["epoch_batches"] = self.epoch_batches[self.own]
        if held:  # (a shard handed on this round is in it too)
            fields["held"] = [{"shard": shard, "drawn": ranges,
                               "epoch_batches": self.epoch_batches.get(shard)}
                              for shard, ranges in sorted(held.items())]
        return fields

    def round_over(self) -> None:
        for s in self.shards.values():
            s.round_start = s.position

    def redraw(self) -> None:
        """The round in progress was dropped: draw its batches again."""
        for shard, s in self.shards.items():
            self.start_at(shard, *s.round_start)

    def others(self) -> list[int]:
        return sorted(s for s in self.shards if s != self.own)

    def positions(self) -> dict[int, tuple[int, int]]:
        return {shard: s.position for shard, s in self.shards.items()}

    def round_starts(self) -> dict[int, tuple[int, int]]:
        return {shard: s.round_start for shard, s in self.shards.items()}

    def hold(self, shard: int, position: tuple[int, int]) -> None:
        self.shards[shard] = Shard(self.make(shard))
        self.epoch_batches[shard] = batches_per_epoch(self.shards[shard].sampler)
        self.start_at(shard, *position)

    def release(self, shard: int) -> None:
        del self.shards[shard]

    def take(self, mine: list[int], position_of: Callable[[int], tuple[int, int]],
             keep: bool, own: bool = False) -> None:
        """The members changed and this worker holds the shards `mine` now (`held_by`): let
        go of the others, and hold those it did not from `position_of(shard)` — and those
        it held already too unless it `keep`s them — and its own where `own` (it joins: a
        member held it while it was away)."""
        for shard in self.others():
            if shard not in mine or not keep:
                self.release(shard)
        for shard in mine:
            if shard == self.own:
                if own:
                    self.start_at(shard, *position_of(shard))
            elif shard not in self.shards:
                self.hold(shard, position_of(shard))


def batches_per_epoch(sampler) -> int | None:
    """A shard's batches per epoch (an injecting sampler wraps the shard's own)."""
    return getattr(getattr(sampler, "sampler", sampler), "batches_per_epoch", None)


def _text(position: tuple[int, int]) -> str:
    return f"{position[0]},{position[1]}"


def _position(text: bytes | str) -> tuple[int, int]:
    epoch, batch = (text.decode() if isinstance(text, bytes) else text).split(",")
    return int(epoch), int(batch)


def publish(store, positions: dict[int, tuple[int, int]],
            drawing: tuple[int, dict[int, tuple[int, int]]] | None = None) -> None:
    """Step 2: where the draws of each shard held have reached (one store write each).
    `drawing`: (round, where each shard's draws of it began), published before that round's
    sum by a mode whose rounds every member completes or none does."""
    for shard, position in positions.items():
        text = _text(position)
        if drawing is not None:
            text += f";{drawing[0]};{_text(drawing[1][shard])}"
        store.set(f"{KEY}/{shard}", text)


def published(store, shard: int, never: tuple[int, int] | None = (0, 0),
              next_round: int | None = None):
    """Step 3: where `shard`'s last holder's draws ended (`never`: never published, its
    start). A position published before a round's sum (`publish`'s `drawing`) counts that
    round's draws only if the survivors completed it: their `next_round` is after it."""
    key = f"{KEY}/{shard}"
    if not store.check([key]):
        return never
    fields = store.get(key).decode().split(";")
    if len(fields) == 3 and next_round is not None and int(fields[1]) >= next_round:
        return _position(fields[2])
    return _position(fields[0])


def unrecorded(store, shard: int, next_round: int
               ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Step 3: where `shard`'s last publish names a round the survivors completed (before
    their `next_round`) and its drawer published nothing after it — it publishes again at
    its round's record: it was lost between the round's sum and its record — that round's
    draws, (from, to): trained, in the global model, and in no record."""
    key = f"{KEY}/{shard}"
    if not store.check([key]):
        return None
    fields = store.get(key).decode().split(";")
    if len(fields) == 3 and int(fields[1]) < next_round:
        return _position(fields[2]), _position(fields[0])
    return None


def ranges(start: tuple[int, int], end: tuple[int, int],
           epoch_batches: int | None) -> list[list[int]]:
    """The [epoch, first, end) ranges of draws from data position `start` to `end` (a
    record's `drawn`, `telemetry/ledger.py`)."""
    if start[0] == end[0]:
        return [[start[0], start[1], end[1]]] if end[1] > start[1] else []
    first = [[start[0], start[1], epoch_batches]] if epoch_batches else []
    return first + ([[end[0], 0, end[1]]] if end[1] > 0 else [])


def retake(held: HeldShards, mine: list[int], store, next_round: int) -> dict[int, list]:
    """Step 3 for `held` after a regroup, the members' `next_round` under way: let go of the
    shards another member holds now, keep those it held already (its own count), and hold
    the new ones of `mine` from where they were published. Returns, by new shard, the
    [epoch, first, end) ranges its lost holder trained in a completed round and recorded
    nowhere (`unrecorded`), for this worker's next record."""
    lost = {shard: done for shard in mine if shard not in held.shards
            and (done := unrecorded(store, shard, next_round)) is not None}
    held.take(mine, lambda shard: published(store, shard, next_round=next_round), keep=True)
    return {shard: ranges(start, end, held.epoch_batches.get(shard))
            for shard, (start, end) in lost.items()}


def hand_over(store, generation: int, shard: int, position: tuple[int, int]) -> None:
    """Step 4, the member that held `shard`: where its draws are as generation
    `generation` begins — published too, as its round's record, written next, will have
    them (a regroup that drops its new holder's first round draws it on from there)."""
    store.set(f"{KEY}/{shard}/{generation}", _text(position))
    publish(store, {shard: position})


def taken_over(store, generation: int, shard: int, wait: float,
               alarm: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """Step 4, the new holder: the position `hand_over` gave, waiting up to `wait` seconds
    for it. CommError once a member raises the `alarm` (the last holder was lost: the
    members regroup, this one with them), CommTimeoutError after `wait`."""
    key, deadline = f"{KEY}/{shard}/{generation}", time.monotonic() + wait
    while not store.check([key]):
        if alarm():
            raise CommError(f"shard {shard}: a member was lost before it was handed over at "
                            f"generation {generation}", op="join")
        if time.monotonic() >= deadline:
            raise CommTimeoutError(f"shard {shard}: its last holder did not hand it over "
                                   f"within {wait:.0f} s of generation {generation}",
                                   op="join", seconds=wait)
        time.sleep(0.02)
    return _position(store.get(key))


def drawer_of(rank: int) -> str:
    """This process's name as a drawer (step 6): its rank, and who it is apart from an
    earlier process of that rank (a claim of what a lost process held must not match its
    successor's)."""
    return f"{rank}/{secrets.token_hex(4)}"


def _rank(drawer: str) -> int:
    return int(drawer.split("/")[0])


def claim(store, shard: int, me: str, lost: Callable[[int], bool]) -> bool:
    """Step 6: make drawer `me` the drawer of `shard` if nobody draws it, it does already,
    it is its own and an earlier process of its rank drew it, or its drawer's rank is
    `lost`; whether it is now (a compare-and-set: one of several claimants is)."""
    key = f"{DRAWER}/{shard}"
    drawer = store.get(key).decode() if store.check([key]) else ""
    if (drawer not in ("", me) and not lost(_rank(drawer))
            and not _rank(drawer) == _rank(me) == shard):
        return False
    return store.compare_set(key, drawer, me).decode() == me


def let_go(store, shard: int, me: str) -> None:
    """Step 6: drawer `me` draws `shard` no more (the caller has published where its draws
    reached)."""
    store.compare_set(f"{DRAWER}/{shard}", me, "")


def follow(held: HeldShards, store, me: str, ranks, lost: set[int]) -> None:
    """Step 6, after a record: drawer `me` (of rank `held.own`) lets go of the shards another
    member holds now (where its draws reached is published already) and claims those it
    holds, from where they were published; the members are the `ranks` not `lost`."""
    mine = held_by(held.own, [r for r in ranks if r not in lost], ranks)
    for shard in held.others():
        if shard not in mine:
            let_go(store, shard, me)
            held.release(shard)
    for shard in mine:
        if shard not in held.shards and claim(store, shard, me, lost.__contains__):
            held.hold(shard, published(store, shard))


def claim_own(store, me: str, shards, wait: float, lost: Callable[[int], bool],
              stopped: Callable[[], bool]) -> bool:
    """Step 6, a worker that joins (drawer `me`): let go of what an earlier process of its
    rank held for others (where it got is published), then take its own shard once the
    member that held it has let go (at its next check), waiting up to `wait` seconds (its
    position: `published`). False if the run `stopped` first; CommTimeoutError after
    `wait`."""
    rank = _rank(me)
    for shard in shards:
        key = f"{DRAWER}/{shard}"
        if shard != rank and store.check([key]):
            drawer = store.get(key).decode()
            if drawer and _rank(drawer) == rank:
                store.compare_set(key, drawer, "")
    deadline = time.monotonic() + wait
    while not claim(store, rank, me, lost):
        if stopped():
            return False
        if time.monotonic() >= deadline:
            raise CommTimeoutError(f"shard {rank}: the worker that held it did not let it go "
                                   f"within {wait:.0f} s", op="join", seconds=wait)
        time.sleep(0.02)
    return True
