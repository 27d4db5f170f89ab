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

BatchNorm running statistics stay local, as in ESync's async trainer. The step is taken on
the server at the run's rate `-l`; the worker's own optimizer is not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.base import (Action, ControlPath, Mode, Step, flatten, gradients,
                                     optimizer_settings, unflatten_into)
from hetsync.algorithms.registry import ModeSpec, register


@dataclass
class AsyncOptions:
    """Options of `async` and `dcasgd` (ESync's `-m async -dcasgd 1` is `-m dcasgd`)."""

    dcasgd: bool = field(default=False, metadata={
        "flags": ("-dcasgd", "--dcasgd"), "help": "with -m async: delay-compensated ASGD (0/1)"})
    dcasgd_lambda: float = field(default=0.04, metadata={
        "flags": ("--dcasgd-lambda",), "help": "DC-ASGD variance-control lambda"})

    def validate(self) -> "AsyncOptions":
        from hetsync.options import invalid_option

        if not 0 <= self.dcasgd_lambda < float("inf"):
            raise invalid_option(self, "dcasgd_lambda", "a number >= 0")
        return self


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

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.clone(), "lr": self.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights, self.lr = state["weights"].clone(), float(state["lr"])


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

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "lambda": self.lam,
                "backup": {w: t.clone() for w, t in self.backup.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.lam = float(state["lambda"])
        self.backup = {int(w): t.clone() for w, t in state["backup"].items()}


def server_rule(weights: torch.Tensor, lr: float, options: AsyncOptions, layout,
                workers: int) -> AsgdRule:
    """The parameter server's rule: DC-ASGD's with `-dcasgd 1`, else ASGD's."""
    if options.dcasgd:
        return DcasgdRule(weights, lr, options.dcasgd_lambda)
    return AsgdRule(weights, lr)


class AsynchronousSGD(Mode):
    """The worker side of `async` and `dcasgd` (the rule on the server makes the difference)."""

    name = "async"
    Options = AsyncOptions
    control = ControlPath.STORE

    @classmethod
    def check_optimizer(cls, optimizer: torch.optim.Optimizer) -> None:
        """The server applies plain SGD to every push, at the optimizer's rate."""
        group = optimizer.param_groups[0]
        if type(optimizer) is not torch.optim.SGD or any(
                group.get(k) for k in ("momentum", "weight_decay", "nesterov")):
            raise ValueError(
                f"mode {cls.name!r}: its parameter server applies plain SGD (w <- w - lr*g) to "
                f"every push; {optimizer_settings(optimizer)} cannot be applied there: use "
                f"torch.optim.SGD(params, lr=...) without momentum or weight decay")

    def setup(self) -> None:
        if self.comm.ps_client is None:
            raise ValueError(f"mode {self.name!r} needs a parameter server")
        with self.comm.clock.phase("comm"):
            weights = self.comm.ps_client.pull()
        unflatten_into(weights.to(self._device()), self.parameters())

    def decide(self, step: Step) -> Action:
        return Action.PUSH

    def apply(self, action: Action) -> None:
        grad = flatten(gradients(self.parameters())).float().cpu()
        with self.comm.clock.phase("comm"):
            weights = self.comm.ps_client.push_pull(grad, rate=self.lr)  # its schedule too
        unflatten_into(weights.to(self._device()), self.parameters())

    def finish(self) -> None:
        """Take the server's weights (after every worker's last push, under hetsync.wrap's
        agreed stop), then say goodbye."""
        with self.comm.clock.phase("comm"):
            weights = self.comm.ps_client.pull()
        unflatten_into(weights.to(self._device()), self.parameters())
        super().finish()

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device


class DelayCompensatedSGD(AsynchronousSGD):
    """`dcasgd`: the worker side is ASGD's; the server applies DC-ASGD's rule."""

    name = "dcasgd"


register(ModeSpec("async", AsynchronousSGD, "push the gradient to the parameter server, which "
                  "applies it at once; pull the weights (ASGD)", options=AsyncOptions,
                  server_rule=server_rule, parameter_server=True,
                  resolve=lambda o: "dcasgd" if o.dcasgd else "async"))
register(ModeSpec("dcasgd", DelayCompensatedSGD, "as async, with delay compensation "
                  "g + λ·g⊙g⊙(w_now − w_pulled) (also -m async -dcasgd 1)",
                  options=AsyncOptions, parameter_server=True,
                  server_rule=lambda w, lr, o, layout, workers: DcasgdRule(
                      w, lr, o.dcasgd_lambda)))
