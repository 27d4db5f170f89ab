"""`DistributedOptimizer.batch_sampler`: a wrapped run's batches, drawn so that a lost worker's
shard goes on being drawn by a survivor, as under `launch` (`runtime/shards.py`; docs/design.md,
"The data ledger").

    sampler = opt.batch_sampler(len(train_set), batch_size=64)
    loader = DataLoader(train_set, batch_sampler=sampler)
    for epoch in range(epochs):                  # one pass over the loader: one epoch
        for x, y in loader: ...

1. The samples are cut into one shard per worker (`data.partition.iid_partition`, seeded:
   ⌊N/P⌋ each, the remainder dropped, as ESync does; with ``partition="by-batch"``
   ⌊N·b_r/Σb⌋, sized by each worker's batch, so that under batches balanced to the devices'
   speeds every worker ends its epoch together), each drawn in batches by its own
   `ShardSampler` (seeded with the seed and its rank, reshuffled every epoch; the last batch
   of an epoch may be short, so that every sample is drawn).
2. One pass over the sampler is one epoch: it yields this worker's batches, one of each shard
   it holds in turn, until every shard it holds has reached the end of the epoch its own
   shard was in when the pass began.
3. Each batch goes into the round under way as it is drawn; at the round's end its record
   names them (`drawn`, `held`) and the sampler publishes in the store where each shard's
   draws reached (`sync`: before the round's sum too, naming the round, as `launch` does).
4. Where the survivors of a lost worker go on (`runtime/membership.py`: ESync's background
   rounds, eager-SGD), the regroup drops the round in progress: each survivor draws its own
   shard again from where its last recorded round ended, and the shards it holds now
   (`shards.holder`) from where their last holder published — within the pass under way, so
   that the lost worker's batches of this epoch are drawn in this epoch.
5. In the asynchronous parameter-server modes, which have no membership to agree on, each
   shard's drawer is named in the store; the workers are those the parameter server has not
   marked lost (its connection closed: `StoreJoin.mark_lost`), and at most twice a second,
   after a record, a worker lets go of the shards another holds now and claims those it
   holds (`shards.follow`, as `launch`'s workers do).

Where it departs from `launch`: an epoch's last batch may be short (`launch` drops it);
`wrap` admits no worker, so no shard is handed back (a machine joins by torchrun's restart of
every worker at the new size: the resumed script's sampler is cut into shards of that size,
and `set_epoch` starts it at its checkpoint's next epoch); a parameter-server mode's worker that
falls silent without its connection closing is found lost only at the stop (`StoreJoin`),
too late for its shard to be taken on. A loss found in `finish()`, or after the passes of
the survivor that holds its shard now are over, leaves the rest of that shard undrawn (and
the round dropped there is not drawn again). A batch counts as drawn, and as trained by the
next step, when the loader asks for it: the sampler is exact with `num_workers=0` (the
default), where the loader asks for each batch as it trains it; worker processes ask a few
batches ahead, and a regroup then leaves some batches trained twice or counted but not
trained, and a pass out of step with the user's epochs.
"""

from __future__ import annotations

import operator
import time
from typing import Callable, Iterator

import torch

from hetsync.data.partition import iid_partition
from hetsync.data.sampler import ShardSampler
from hetsync.runtime import shards
from hetsync.runtime.rounds import RoundAccount


#: the cuts a wrapped run's sampler makes (`launch`'s `--partition` of the same names)
SAMPLER_PARTITIONS = ("iid", "by-batch")


def check_epoch(epoch) -> None:
    """`set_epoch`'s argument (the sampler's and the wrapped optimizer's): an int >= 0."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"set_epoch({epoch!r}): expected an int >= 0")


class ShardBatchSampler(torch.utils.data.Sampler):
    """A `DataLoader`'s ``batch_sampler`` for worker `rank` of `workers` in a wrapped run
    (see the module docstring); made by `DistributedOptimizer.batch_sampler`. `batch_sizes`:
    every worker's; `account()`: the round under way's account, which each draw goes into."""

    def __init__(self, rank: int, workers: int, num_samples: int, batch_sizes: list[int],
                 account: Callable[[], RoundAccount], *, shuffle: bool, seed: int,
                 partition: str = "iid"):
        try:
            seed = operator.index(seed)
        except TypeError:
            raise ValueError(f"seed={seed!r}: expected an int >= 0") from None
        if partition not in SAMPLER_PARTITIONS:
            raise ValueError(f"partition={partition!r}: expected one of "
                             f"{', '.join(map(repr, SAMPLER_PARTITIONS))}")
        parts = iid_partition(num_samples, workers, seed,  # (ValueError: names the value)
                              batch_sizes if partition == "by-batch" else None)

        def sampler_of(rank: int) -> ShardSampler:
            return ShardSampler(parts[rank], batch_sizes[rank], seed=seed * 1000 + rank,
                                shuffle=shuffle, drop_last=False)

        self.rank, self.workers, self._account = rank, workers, account
        self.held = shards.HeldShards(rank, sampler_of(rank), sampler_of)
        #: this process as a drawer of shards (step 5), and when it looks for the lost next
        self.drawer, self._next_check = shards.drawer_of(rank), 0.0
        self._own_batch = batch_sizes[rank]
        #: the last batch's size in this worker's own batches (a lost worker's batch is its
        #: own size: `Mode.batch_share`, as `launch` sets it)
        self.share = 1.0

    def __len__(self) -> int:
        """This worker's own shard's batches per epoch (a pass draws more where it holds a
        lost worker's shard too: a schedule sized by ``len(loader)`` then runs past its
        end)."""
        return self.held.epoch_batches[self.rank]

    def __iter__(self) -> Iterator[list[int]]:
        """Step 2: one epoch's batches (lists of sample indices)."""
        before = self.held.at(self.rank)[0] + 1
        while (got := self.held.draw(before)) is not None:
            shard, epoch, number, indices = got
            self._account().draw(epoch, number, shard=None if shard == self.rank else shard)
            self.share = 1.0 if shard == self.rank else len(indices) / self._own_batch
            yield indices.tolist()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass draws, as `DistributedSampler.set_epoch`: each shard held
        at an epoch's start before `epoch` starts at `epoch`'s first batch (its own
        permutation of that epoch), so that a script resumed from its checkpoint at an
        epoch's end — after `torchrun` started it again, at the same size or another —
        draws that epoch and not the first one again. A shard mid-epoch, or at `epoch` or
        past it, is left where it is: called every epoch, it changes nothing."""
        check_epoch(epoch)
        for shard in self.held.shards:
            at_epoch, batch = self.held.at(shard)
            if batch == 0 and at_epoch < epoch:
                self.held.start_at(shard, epoch, 0)

    def before_sum(self, store, round_: int) -> None:
        """Step 3 where a round's draws are in every member's model or in none
        (`Mode.rounds_all_or_none`): where they stand is published before round `round_`'s
        sum, naming it, in place of after its record (`runtime/shards.py`, step 2)."""
        shards.publish(store, self.held.positions(), (round_, self.held.round_starts()))

    def round_over(self, store) -> None:
        """Step 3, after the round's record: the next round's draws begin here, and where
        they reached is published (`store`: None where no survivor would take a shard
        on)."""
        self.held.round_over()
        if store is not None:
            shards.publish(store, self.held.positions())

    def claims(self, store) -> None:
        """Step 5, at the start: name this worker the drawer of its own shard."""
        store.set(f"{shards.DRAWER}/{self.rank}", self.drawer)

    def follow(self, store, lost: Callable[[int], bool]) -> None:
        """Step 5, after a record's publish (at most twice a second): let go of and claim
        shards as the workers not `lost` hold them."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 0.5
        ranks = range(self.workers)
        shards.follow(self.held, store, self.drawer, ranks, {r for r in ranks if lost(r)})

    def regrouped(self, store, members: list[int], next_round: int) -> dict[int, list]:
        """Step 4: the round in progress was dropped and `members` go on from round
        `next_round`: the shards this worker held already from its own count, new ones from
        where they were published (`TrainingLoop._retake_shards`). Returns, by new shard,
        the draws its lost holder trained in a completed round and did not record (its
        ranges, for the next round's record: `shards.unrecorded`)."""
        lost = shards.retake(self.held, shards.held_by(self.rank, members,
                                                       range(self.workers)),
                             store, next_round)
        self.held.redraw()
        return lost
