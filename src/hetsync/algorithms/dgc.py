"""`dgc`: Deep Gradient Compression (Lin et al., ICLR 2018) on the asynchronous parameter server.

Per step, on every worker (`hetsync.algorithms.sparse_ps` for the shared steps):

1. with `--dgc-clip C`: clip the gradient's norm to C/√P (local gradient clipping; off by
   default, as in its authors' code);
2. momentum correction: u ← m·u + g; v ← v + u (`MomentumCorrection`; m = 0.7, the momentum
   of DGS's comparison — the paper's 0.9 is for synchronous all-reduce, and on the
   asynchronous server, where staleness adds momentum of its own, 0.9 diverged here);
3. pick ρ of each layer of v by DGC's sampled threshold (`SampledTopK`: a 1 % strided sample,
   adapted to stay within 0.8–1.3 × k, else the exact top-k); send lr·v there, zero u and v
   there (momentum-factor masking);
4. the server applies W ← W − s and the weight decay W ← W − lr·wd·W (kept out of the
   compressed gradient), and answers the dense W.

The density warms up exponentially over the worker's first epochs, as the paper's schedule
(sparsity 75 % → 93.75 % → 98.4 % → 99.6 %, then 99.9 %: `warmup_density`), to 0.1 %.

Where hetsync departs from the paper: the paper sums the sparse gradients of all workers
synchronously (an all-gather); here, as in DGS's comparison, each worker's push is applied by
the asynchronous server at once. The server's weight decay uses the run's base rate.
"""

from __future__ import annotations

import math

import torch

from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.sparse_ps import SparseApplyRule, SparseAsyncSGD, SparseOptions

#: the density's factor per warm-up epoch (sparsity 75 %, 93.75 %, ...)
WARMUP_FACTOR = 0.25


def warmup_density(epoch: int, final: float, warmup_epochs: int) -> float:
    """DGC's exponential warm-up: 0.25^(epoch+1) during the first `warmup_epochs` epochs
    (never below `final`), then `final`."""
    if epoch >= warmup_epochs:
        return final
    return max(final, WARMUP_FACTOR ** (epoch + 1))


class DeepGradientCompression(SparseAsyncSGD):
    name = "dgc"
    memory_name = "momentum-correction"
    selector_name = "sampled-topk"
    default_density = 0.001
    default_momentum = 0.7

    def density(self) -> float:
        return warmup_density(self.epoch, self.base_density, self.options.warmup_epochs)

    def _clipped(self, grad: torch.Tensor) -> torch.Tensor:
        if self.options.clip is None:
            return grad
        limit = self.options.clip / math.sqrt(self.comm.run_workers or self.comm.workers)
        norm = float(grad.norm())
        return grad * (limit / norm) if norm > limit else grad


register(ModeSpec("dgc", DeepGradientCompression, "deep gradient compression: momentum "
                  "correction and factor masking, 0.1 % per layer after an exponential "
                  "warm-up, pushed to the parameter server, which answers the dense model",
                  options=SparseOptions, parameter_server=True,
                  server_rule=lambda w, lr, o, layout, workers: SparseApplyRule(
                      w, lr, o.weight_decay),
                  lr_note="worker rate"))
