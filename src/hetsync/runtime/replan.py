"""Balanced batches re-planned as the devices' measured speeds drift (`--replan-drift`).

LB-BSP (Chen et al., "Semi-dynamic load balancing: efficient distributed learning in
non-dedicated environments", SoCC 2020) sizes each worker's batch to its device's speed so
that a synchronous step waits for nobody, and re-sizes the batches as the speeds change.
`--balanced-batches 1` sizes them at the start, from `--slowdowns` or the speeds the workers
measure there (`worker.measured_speeds`); with `--replan-drift D` > 0, in a mode whose every
round is one blocking sum of every member (`Mode.rounds_all_or_none`: `sync`), a worker's
`BatchPlan` then goes on as follows:

1. each worker meters its own device: the samples of its steps over their compute time (the
   emulated slowdown included; waits and communication not), since the last check (`meter`);
2. every `EVERY` rounds, at a round's end after its record (`due`, the pure predicate), one
   sum of a vector that holds each worker's speed in its own slot (`measured`) gives every
   member every speed;
3. `drifted`: where a speed relative to the fastest's differs from the one the batches
   follow by more than D (as a fraction of it), every member adopts the same new plan from
   the same sum (`adopt`): batch_i = -b × speed_i ÷ the fastest's (`balanced_batches`) and
   sample weight_i = P × batch_i ÷ Σ batch, so that a step's sum is still the mean over its
   samples; the leader says so in a ``replan`` event, and every round's record names its
   worker's ``batch``;
4. a lost worker has no speed in the sum (0): it keeps the one it was planned with, and a
   survivor draws its shard at its batch (`runtime/shards.py`);
5. a regroup and an admission give every member the leader's plan, with its counts
   (`TrainingLoop._take_leaders_counts`): a member lost during the sum of step 2 may have
   left some survivors with the new plan and others without it.

So that a batch may change size anywhere in an epoch, a re-planning run draws each shard a
sample at a time (a `ShardSampler` of batch 1), a step taking its batch's worth: its data
positions (checkpoints, the store's, a lost worker's shard) and its ledger count samples.

Where hetsync departs from LB-BSP: LB-BSP predicts each worker's speed for the next
iteration and sizes every iteration's batches from it; hetsync re-plans only past a drift,
from the speeds measured over the last `EVERY` rounds (a real device's speed wanders by a few
per cent from step to step; a plan that chased it would change every round). A resumed run
starts from the plan the run started with (its positions count samples, whatever the
batches) and re-plans once its speeds are measured to drift. `hetsync.wrap` does not re-plan
(the user's loader holds the batch size).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetsync.clock.profile import balanced_batches, sample_weights

#: rounds between two checks of the speeds (step 2)
EVERY = 10


def due(round_: int) -> bool:
    """Step 2's predicate: whether the speeds are compared at the end of round `round_`."""
    return round_ > 0 and round_ % EVERY == 0


def relative(measured: list[float], planned: list[float]) -> list[float]:
    """Each worker's measured speed relative to the fastest measured (1); a worker without
    one (lost: 0) keeps its planned speed (step 4)."""
    fastest = max(measured, default=0.0)
    if fastest <= 0:
        return list(planned)
    return [m / fastest if m > 0 else p for m, p in zip(measured, planned)]


def drifted(planned: list[float], measured: list[float], drift: float) -> bool:
    """Step 3's predicate: whether a relative speed (`relative`) differs from its planned one
    by more than `drift` of it."""
    return any(abs(m - p) > drift * p for m, p in zip(measured, planned))


@dataclass
class BatchPlan:
    """The batches one worker's run follows: -b (`batch_size`, the fastest device's) and
    each worker's speed relative to the fastest's; and this worker's meter since the last
    check (step 1)."""

    batch_size: int
    speeds: list[float]
    drift: float
    samples: int = 0
    seconds: float = 0.0
    #: each worker's batch, as `speeds` make them
    batches: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.adopt(self.speeds)

    @classmethod
    def of(cls, cfg) -> "BatchPlan | None":
        """The plan a run starts with (`cfg`: its `Config`); None where it does not
        re-plan (`Config.replans`)."""
        if not cfg.replans:
            return None
        # (the speeds per sample its batches make alike: b_i / -b where every step takes
        # as long, whatever the devices' fixed parts per step)
        return cls(cfg.batch_size, [cfg.batch_of(r) / cfg.batch_size
                                    for r in range(cfg.workers)], cfg.replan_drift)

    def adopt(self, speeds: list[float]) -> None:
        """Follow `speeds` (relative to the fastest's) from now on (step 3)."""
        self.speeds = [float(s) for s in speeds]
        self.batches = balanced_batches(self.batch_size, [1.0 / s for s in self.speeds])

    def sample_weight_of(self, rank: int) -> float:
        return sample_weights(self.batches)[rank]

    def meter(self, samples: int, seconds: float) -> None:
        """Step 1: a round's samples and compute seconds."""
        self.samples += samples
        self.seconds += seconds

    def measured(self, rank: int) -> torch.Tensor:
        """Step 2: this worker's speed since the last check (samples per second) in its own
        slot of a vector of zeros; the meter starts over."""
        speeds = torch.zeros(len(self.speeds), dtype=torch.float64)
        if self.seconds > 0:
            speeds[rank] = self.samples / self.seconds
        self.samples, self.seconds = 0, 0.0
        return speeds

    def replanned(self, summed: list[float]) -> list[float] | None:
        """Step 3: the speeds to follow from the members' summed `measured` vectors, or None
        where none drifted."""
        speeds = relative(summed, self.speeds)
        return speeds if drifted(self.speeds, speeds, self.drift) else None
