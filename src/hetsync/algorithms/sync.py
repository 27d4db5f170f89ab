"""`sync`: synchronous SGD (SSGD) — every step, the mean gradient of all workers.

Per step, on every worker:

1. forward and backward on the local batch;
2. all-reduce the gradients and the BatchNorm statistics (one flat buffer, with a count of
   contributors, then the training loop's four floats of agreement: `ControlPath.WITH_SUM`,
   one collective a step; a fast worker's wait for the slowest is inside it, timed as
   `comm`) over the chosen collective and divide by the number of workers (under
   `hetsync.wrap`, a worker whose data ran out contributes nothing and is not counted);
   with `--balanced-batches` (LB-BSP: Chen et al., "Semi-dynamic load balancing", SoCC 2020)
   each gradient is weighted by its batch first, so the mean is over samples;
3. apply the same optimizer step everywhere, set the BatchNorm statistics to their mean.

As ESync's `sync` trainer does, BatchNorm running statistics are averaged every step, so the
workers' models stay identical.
"""

from __future__ import annotations

from hetsync.algorithms.base import (Action, ControlPath, Mode, Step, bn_statistics,
                                     gradients, mean_of, pack, set_gradients, with_count)
from hetsync.algorithms.registry import ModeSpec, register


class SynchronousSGD(Mode):
    name = "sync"
    counts_contributors = True
    control = ControlPath.WITH_SUM

    def setup(self) -> None:
        self.broadcast_model()

    def decide(self, step: Step) -> Action:
        return Action.AVERAGE_GRADIENTS

    def apply(self, action: Action) -> None:
        params = self.parameters()
        grads, stats = gradients(params), bn_statistics(self.model)
        if self.comm.sample_weight != 1:  # the mean over samples where batches differ (every
            # worker contributes: the weights are P's, and hetsync.wrap, which may leave one
            # out, does not set them)
            grads = [g * self.comm.sample_weight for g in grads]
        mean, self.contributors = mean_of(self.sum_with_proposal(
            with_count(pack(grads + stats), not self.joined)))
        if self.contributors:  # (none: every worker has joined, nothing to apply)
            set_gradients(mean, params, stats)
            self.optimizer.step()


register(ModeSpec("sync", SynchronousSGD, "one step; mean of all gradients; the same update "
                  "everywhere (SSGD)", lr_scaling="workers", lr_note="x workers",
                  counts_samples=True))
