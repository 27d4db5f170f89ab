"""`sync`: synchronous SGD (SSGD) — every step, the mean gradient of all workers.

Per step, on every worker:

1. forward and backward on the local batch;
2. all-reduce the gradients, each weighted by its step's samples over a batch of -b
   (`CommContext.sample_weight` × `Mode.batch_share`), the BatchNorm statistics, the weight,
   the share of a worker whose data has run out, and a count of contributors (one flat
   buffer, then the training loop's four floats of agreement: `ControlPath.WITH_SUM`, one
   collective a step; a fast worker's wait for the slowest is inside it, timed as `comm`)
   over the chosen collective;
3. divide the gradients by what a step of the run's workers weighs (P: with every worker
   in, the summed weight, so the mean over every sample of the step; with equal batches on
   every worker, the mean of the P gradients) and the statistics by the count (under
   `hetsync.wrap`, a worker whose data ran out contributes nothing, is not counted and its
   share is not waited for); apply the same optimizer step everywhere, set the BatchNorm
   statistics to their mean.

With `--balanced-batches` (LB-BSP: Chen et al., "Semi-dynamic load balancing", SoCC 2020) the
batches differ and the weights make the mean one over samples. As ESync's `sync` trainer does,
BatchNorm running statistics are averaged every step, so the workers' models stay identical.

A lost worker (`runtime/membership.py`; where hetsync departs from SSGD as published, which
stops): the sum fails on the survivors connected to the lost worker (gloo's connections close
at once; a silent peer's at --timeout), the others hear the regroup's alarm while they wait
(`CommContext.hear`), the survivors regroup, and `rejoin` gives every survivor the leader's
model, BatchNorm statistics, optimizer state and round (`leader_state.py`: no survivor applied
the failed step, but none can know that of the others). The survivors go on, one of them drawing
the lost worker's shard in turn with its own (`runtime/shards.py`). The sum still divides by
a whole step's weight, so a step of the survivors is the sum over the samples that arrived
over a whole step's samples: its size follows the samples it carries (the linear scaling
rule: Goyal et al., 2017), as torch's `Join` divides by the initial world size, where the
mean over the survivors' fewer samples would take a whole step's size on fewer samples. A
worker that joins takes the same state (`admit`).
"""

from __future__ import annotations

import torch

from hetsync.algorithms.base import (Action, Admits, ControlPath, Mode, Step, bn_statistics,
                                     gradients, pack, set_gradients, unflatten_into, with_count)
from hetsync.algorithms.leader_state import take_leaders_state
from hetsync.algorithms.registry import ModeSpec, register


class SynchronousSGD(Admits, Mode):
    name = "sync"
    counts_contributors = True
    rounds_all_or_none = True
    control = ControlPath.WITH_SUM

    def setup(self) -> None:
        self.broadcast_model()

    def decide(self, step: Step) -> Action:
        return Action.AVERAGE_GRADIENTS

    def apply(self, action: Action) -> None:
        params = self.parameters()
        grads, stats = gradients(params), bn_statistics(self.model)
        weight = 0.0 if self.joined else self.comm.sample_weight * self.batch_share
        out = self.comm.sample_weight if self.joined else 0.0  # (its share sits out)
        summed = self.sum_with_proposal(with_count(pack(
            [g * weight for g in grads] + stats + [grads[0].new_tensor([weight, out])]),
            not self.joined))
        self.contributors = int(round(float(summed[-1])))
        if self.contributors:  # (none: every worker has joined, nothing to apply)
            n = sum(g.numel() for g in grads)
            set_gradients(summed[:n] / self._full_step(summed[-3], summed[-2]), params)
            unflatten_into(summed[n:-3] / self.contributors, stats)
            self.optimizer.step()

    def _full_step(self, arrived: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """What a step of the run's workers weighs (step 3 of the module docstring): the
        run's workers' shares (P) less those of the workers whose data has run out under
        `hetsync.wrap` (they sit out, as they would in every step); never less than what
        arrived. A spare that has not joined yet (`--spare-workers`) counts as missing, as a
        lost worker does: the step is sized to the samples present."""
        run = float(self.comm.run_workers or self.comm.workers)
        return torch.clamp(run - out, min=float(arrived))

    def rejoin(self) -> None:
        """After a regroup: the leader's model, statistics, optimizer state and round."""
        self._take_leaders()

    def admit(self, joined: bool) -> None:
        """A worker joins at a round's end: every member, the joiner too, holds the leader's
        model, statistics, optimizer state and round."""
        self._take_leaders()

    def _take_leaders(self) -> None:
        tensors = self.parameters() + list(self.model.buffers())
        self.round = int(take_leaders_state(self.comm, tensors, self.optimizer,
                                            [self.round])[0])

def sum_length(model_numel: int, stats_numel: int, options) -> int:
    """A step's sum (step 2): the gradients, the statistics, the weight, the share that
    sits out and the count."""
    return model_numel + stats_numel + 3


register(ModeSpec("sync", SynchronousSGD, "one step; mean of all gradients; the same update "
                  "everywhere (SSGD)", lr_scaling="workers", lr_note="x workers",
                  counts_samples=True, sum_length=sum_length))
