"""The data ledger: which batches of each shard the workers drew, epoch by epoch, in the run
as it stands (records cut back to a checkpoint on resume are not in it).

Every round's record names the [epoch, first batch, end batch) ranges of the worker's shard
it drew (`drawn`) and the shard's batches per epoch (`epoch_batches`); a worker that draws
another's shard too (a lost worker's or an absent spare's, `runtime/shards.py`) records those
apart (`held`: shard, ranges, its batches per epoch). A worker's sampler is deterministic
(seeded by the run's seed and its rank), so a batch index names its samples, whoever draws it.
Per shard and epoch, a batch drawn by two recorded rounds is *twice*; one missing below the
highest batch drawn in that epoch, or in an epoch the shard's draws went past, is *skipped*
(its round was dropped: a regroup discards a round in flight); the batches nobody had reached
when the run ended are *left* in its last epoch. A run whose batches are re-planned draws a
sample at a time (`runtime/replan.py`): its records say so (``ledger_unit``), and its ledger's
"batches" are samples (`unit`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable


def shard_draws(workers: dict[int, list[dict[str, Any]]]
                ) -> dict[int, tuple[list[list[int]], int | None, list[int]]]:
    """Shard -> (every recorded range of its draws, by any worker; its batches per epoch;
    the workers that drew it)."""
    ranges: dict[int, list[list[int]]] = defaultdict(list)
    batches: dict[int, int | None] = {}
    by: dict[int, set[int]] = defaultdict(set)
    for rank, records in workers.items():
        for r in records:
            for shard, drawn, epoch_batches in _draws(r, rank):
                ranges[shard] += drawn
                batches[shard] = epoch_batches or batches.get(shard)
                by[shard].add(rank)
    return {shard: (ranges[shard], batches.get(shard), sorted(by[shard])) for shard in ranges}


def _draws(record: dict[str, Any], rank: int):
    if record.get("drawn"):
        yield rank, record["drawn"], record.get("epoch_batches")
    for held in record.get("held") or ():
        yield int(held["shard"]), held["drawn"], held.get("epoch_batches")


def shard_ledger(drawn: Iterable[list[int]], epoch_batches: int | None) -> dict[str, Any] | None:
    """One shard's ledger from its ranges of draws; None where there are none."""
    counts: dict[int, Counter] = defaultdict(Counter)
    for epoch, first, end in drawn:
        counts[int(epoch)].update(range(int(first), int(end)))
    if not counts:
        return None
    last = max(counts)
    twice = skipped = 0
    for epoch, taken in counts.items():
        twice += sum(n - 1 for n in taken.values() if n > 1)
        top = epoch_batches if (epoch < last and epoch_batches) else max(taken) + 1
        skipped += sum(1 for b in range(top) if b not in taken)
    left = (epoch_batches - max(counts[last]) - 1) if epoch_batches else None
    return {"epochs": last + 1, "batches_twice": twice, "batches_skipped": skipped,
            "batches_left_in_last_epoch": left, "epoch_batches": epoch_batches}


def reached(records: Iterable[dict[str, Any]], shard: int | None = None
            ) -> dict[str, int] | None:
    """Where the recorded draws of a shard end: the data position (``epoch``, batches of it
    taken) to go on from so that none is drawn twice; None where none is recorded. The
    records are one worker's, of its own shard; or, with `shard`, any workers' (each
    record names its ``rank``), of that shard, its own worker's draws and its holders'."""
    ends = []
    for r in records:
        if shard is None or int(r.get("rank", -1)) == shard:
            ends += [(int(e), int(end)) for e, _, end in r.get("drawn") or ()]
        if shard is not None:
            ends += [(int(e), int(end)) for held in r.get("held") or ()
                     if int(held["shard"]) == shard for e, _, end in held["drawn"]]
    if not ends:
        return None
    epoch, batch = max(ends)
    return {"epoch": epoch, "batch": batch}


def shard_ranges(records: Iterable[dict[str, Any]], shard: int
                 ) -> tuple[list[list[int]], int | None]:
    """Every range of `shard`'s draws that `records` (each naming its ``rank``) hold, its
    own worker's and its holders', and its batches per epoch where one of them says."""
    ranges, epoch_batches = [], None
    for r in records:
        for which, drawn, batches in _draws(r, int(r.get("rank", -1))):
            if which == shard:
                ranges += drawn
                epoch_batches = batches or epoch_batches
    return ranges, epoch_batches


def position(epoch: int, batch: int, epoch_batches: int | None) -> tuple[int, int]:
    """A data position with an epoch's end written as the next epoch's start (where
    `epoch_batches` is known), so that positions compare across the boundary."""
    if epoch_batches is not None and batch >= epoch_batches:
        return epoch + 1, 0
    return epoch, batch


def covered(start: tuple[int, int], drawn: Iterable[list[int]],
            epoch_batches: int | None) -> tuple[int, int]:
    """Where a shard's draws reach without a gap from data position `start`: every
    [epoch, first, end) range of `drawn` that begins at or before where they have reached and
    ends past it extends them."""
    at = position(*start, epoch_batches)
    for epoch, first, end in sorted((int(e), int(f), int(n)) for e, f, n in drawn):
        if position(epoch, first, epoch_batches) <= at < position(epoch, end, epoch_batches):
            at = position(epoch, end, epoch_batches)
    return at


def run_ledger(workers: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Every shard's ledger (under its worker's rank, with the workers that drew it,
    `drawn_by`), the run's totals of batches drawn twice and skipped, and what a batch is
    there (`unit`: batch, or sample)."""
    per = {shard: {**led, "drawn_by": by} for shard, (drawn, batches, by)
           in sorted(shard_draws(workers).items())
           if (led := shard_ledger(drawn, batches)) is not None}
    if not per:
        return None
    unit = next((r["ledger_unit"] for records in workers.values() for r in records
                 if r.get("ledger_unit")), "batch")
    return {"unit": unit, "batches_twice": sum(led["batches_twice"] for led in per.values()),
            "batches_skipped": sum(led["batches_skipped"] for led in per.values()),
            "per_worker": {str(shard): led for shard, led in per.items()}}
