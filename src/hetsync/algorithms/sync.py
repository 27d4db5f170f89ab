"""`sync`: synchronous SGD (SSGD) — every step, the mean gradient of all workers.

Per step, on every worker:

1. forward and backward on the local batch;
2. wait for every worker (barrier, timed as `wait`);
3. all-reduce the gradients (one flat buffer, with the BatchNorm statistics and the control
   vector) over the chosen collective and divide by the number of workers;
4. apply the same optimizer step everywhere, set the BatchNorm statistics to their mean.

As ESync's `sync` trainer does, BatchNorm running statistics are averaged every step, so the
workers' models stay identical.
"""

from __future__ import annotations

import torch

from hetsync.algorithms.base import (Algorithm, bn_statistics, gradients, pack,
                                     unflatten_into)


class SynchronousSGD(Algorithm):
    name = "sync"

    def setup(self) -> None:
        self.broadcast_model()

    def synchronize(self, control: torch.Tensor | None = None) -> None:
        params = self.parameters()
        grads, stats = gradients(params), bn_statistics(self.model)
        buffer = pack(grads + stats, control)
        self.comm.wait_for_peers()
        buffer = self.comm.all_reduce(buffer)
        n_model = sum(t.numel() for t in grads + stats)
        mean = buffer[:n_model] / self.comm.workers
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        unflatten_into(mean, [p.grad for p in params] + stats)
        self.optimizer.step()
        self.round += 1
        self._control = None if control is None else buffer[n_model:]
