"""`async` (ASGD) and `dcasgd` (DC-ASGD) over the parameter server.

Per step, on every worker (no worker ever waits for another):

1. forward and backward on the local batch, at the weights it last pulled;
2. push the gradient to the parameter server, which applies it at once through its rule;
3. receive the server's latest weights in the same exchange and continue from them.

Server rules (they hold the model as one flat fp32 vector):

- ASGD: w ← w − lr·g.
- DC-ASGD (Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation",
  ICML 2017, as MXNet's `DCASGD` optimizer that ESync's `-dcasgd 1` uses): with w_bak[k] the
  weights worker k last received, g̃ = g + λ·g⊙g⊙(w − w_bak[k]); w ← w − lr·g̃; w_bak[k] ← w.

BatchNorm running statistics stay local, as in ESync's async trainer.
"""

from __future__ import annotations

import torch

from hetsync.algorithms.base import Algorithm, flatten, gradients, unflatten_into


class AsgdRule:
    """The server side of ASGD: apply each pushed gradient at once, answer the new weights."""

    def __init__(self, weights: torch.Tensor, lr: float):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.weights, self.lr = weights.detach().clone().float(), lr

    def pull(self, worker: int) -> torch.Tensor:
        return self.weights

    def push(self, worker: int, update: torch.Tensor) -> torch.Tensor:
        self.weights.add_(self._compensate(worker, update.to(self.weights.dtype)), alpha=-self.lr)
        return self.pull(worker)

    def _compensate(self, worker: int, grad: torch.Tensor) -> torch.Tensor:
        return grad


class DcasgdRule(AsgdRule):
    """DC-ASGD: ASGD with the gradient corrected by λ·g⊙g⊙(w_now − w_at_pull)."""

    def __init__(self, weights: torch.Tensor, lr: float, lam: float = 0.04):
        super().__init__(weights, lr)
        if lam < 0:
            raise ValueError(f"lambda must be >= 0, got {lam}")
        self.lam = lam
        self.backup: dict[int, torch.Tensor] = {}

    def pull(self, worker: int) -> torch.Tensor:
        self.backup[worker] = self.weights.clone()
        return self.weights

    def _compensate(self, worker: int, grad: torch.Tensor) -> torch.Tensor:
        seen = self.backup.get(worker, self.weights)
        return grad + self.lam * grad * grad * (self.weights - seen)


class AsynchronousSGD(Algorithm):
    """The worker side of `async` and `dcasgd` (the rule on the server makes the difference)."""

    name = "async"
    collective_control = False

    def __init__(self, model, optimizer, comm, *, server_lr: float):
        super().__init__(model, optimizer, comm)
        self.server_lr = server_lr

    def setup(self) -> None:
        with self.comm.clock.phase("comm"):
            weights = self.comm.ps_client.pull()
        unflatten_into(weights.to(self._device()), self.parameters())

    def synchronize(self, control: torch.Tensor | None = None) -> None:
        grad = flatten(gradients(self.parameters())).float().cpu()
        with self.comm.clock.phase("comm"):
            weights = self.comm.ps_client.push_pull(grad)
        unflatten_into(weights.to(self._device()), self.parameters())
        self.round += 1

    @property
    def lr(self) -> float:
        return self.server_lr  # the step is taken on the server

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device
