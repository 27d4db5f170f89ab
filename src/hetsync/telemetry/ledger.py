"""The data ledger: which batches of its shard each worker drew, epoch by epoch, in the run
as it stands (records cut back to a checkpoint on resume are not in it).

Every round's record names the [epoch, first batch, end batch) ranges of the worker's shard
it drew (`drawn`) and the shard's batches per epoch (`epoch_batches`). A worker's sampler is
deterministic (seeded by the run's seed and the rank), so a batch index names its samples.
Per worker and epoch, a batch drawn by two recorded rounds is *twice*; one missing below
the highest batch drawn in that epoch, or in an epoch the worker went past, is *skipped*
(its round was dropped: a regroup discards a round in flight); the batches a worker had
not reached when the run ended, or when it was lost, are *left* in its last epoch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable


def worker_ledger(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """One worker's ledger from its round records; None where they name no draws."""
    counts: dict[int, Counter] = defaultdict(Counter)
    epoch_batches = None
    for r in records:
        for epoch, first, end in r.get("drawn") or ():
            counts[int(epoch)].update(range(int(first), int(end)))
        epoch_batches = r.get("epoch_batches", epoch_batches)
    if not counts:
        return None
    last = max(counts)
    twice = skipped = 0
    for epoch, drawn in counts.items():
        twice += sum(n - 1 for n in drawn.values() if n > 1)
        top = epoch_batches if (epoch < last and epoch_batches) else max(drawn) + 1
        skipped += sum(1 for b in range(top) if b not in drawn)
    left = (epoch_batches - max(counts[last]) - 1) if epoch_batches else None
    return {"epochs": last + 1, "batches_twice": twice, "batches_skipped": skipped,
            "batches_left_in_last_epoch": left, "epoch_batches": epoch_batches}


def reached(records: Iterable[dict[str, Any]]) -> dict[str, int] | None:
    """Where a worker's recorded draws end: the data position (``epoch``, batches of it
    taken) to go on from so that none is drawn twice; None where none is recorded."""
    last = None
    for r in records:
        if r.get("drawn"):
            last = r["drawn"][-1]
    return None if last is None else {"epoch": int(last[0]), "batch": int(last[2])}


def run_ledger(workers: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Every worker's ledger and the run's totals of batches drawn twice and skipped."""
    per = {rank: worker_ledger(records) for rank, records in sorted(workers.items())}
    per = {rank: led for rank, led in per.items() if led is not None}
    if not per:
        return None
    return {"batches_twice": sum(led["batches_twice"] for led in per.values()),
            "batches_skipped": sum(led["batches_skipped"] for led in per.values()),
            "per_worker": {str(rank): led for rank, led in per.items()}}
