"""What `dgs`, `gd` and `dgc` share: an asynchronous parameter server carrying sparse updates.

Per step, on every worker (no worker waits for another):

1. forward and backward on the local batch, at the model it last received;
2. fold the gradient into the mode's error-feedback memory (`hetsync.compression.memory`):
   ``candidate = memory.accumulate(g, w, lr)``, lr the worker's optimizer's current rate;
3. pick the top ρ of each layer of the candidate (`hetsync.compression.sparsify`) and take
   their values out of the memory;
4. push them as one sparse message (int32 indices, fp32 values: 8 bytes per non-zero, sizes in
   the header) and apply *only* the server's reply: dense weights (``gd``, ``dgc``) replace the
   model; a sparse difference (``dgs``) is added to it.

The server (`SparseApplyRule`, or DGS's own) subtracts each push from the global weights W as
it comes, one request at a time. The worker's optimizer is not stepped: its rate, momentum and
weight decay are read from it, so a scheduler on it changes what is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from hetsync.algorithms.base import (Action, ControlPath, Mode, Step, flatten, gradients,
                                     optimizer_settings, unflatten_into)
from hetsync.comm.wire import INDEX_DTYPE, SparseMessage
from hetsync.compression import Layout, memory, selector


@dataclass
class SparseOptions:
    """Options of the sparse parameter-server modes (a field names the modes it applies to)."""

    density: float | None = field(default=None, metadata={
        "flags": ("--density",), "help": "fraction of each layer sent per push, at least one "
                                         "element (default: 0.01 for dgs and gd, 0.001 for dgc)"})
    momentum: float | None = field(default=None, metadata={
        "flags": ("--sparse-momentum",), "help": "dgs/dgc: momentum of the memory (default: "
                                                 "--momentum if > 0, else 0.7)"})
    weight_decay: float = field(default=0.0, metadata={
        "flags": ("--sparse-weight-decay",), "help": "weight decay (dgs, gd: in the sent "
                                                     "update; dgc: applied by the server)"})
    resync: int = field(default=150, metadata={
        "flags": ("--dgs-resync",), "help": "dgs: every this many updates applied (all "
                                            "workers), snapshot S <- W; each worker's next "
                                            "reply is S, dense"})
    warmup_epochs: int = field(default=4, metadata={
        "flags": ("--dgc-warmup-epochs",), "help": "dgc: epochs of exponential sparsity "
                                                   "warm-up (density 0.25^(e+1)); 0: none"})
    clip: float | None = field(default=None, metadata={
        "flags": ("--dgc-clip",), "help": "dgc: clip each worker's gradient norm to "
                                          "CLIP/sqrt(workers) (local gradient clipping)"})

    def validate(self) -> "SparseOptions":
        from hetsync.options import invalid_option

        if self.density is not None and not 0 < self.density <= 1:
            raise invalid_option(self, "density", "a number in (0, 1]")
        if self.momentum is not None and not 0 < self.momentum < 1:
            raise invalid_option(self, "momentum", "a number in (0, 1)")
        if not 0 <= self.weight_decay < float("inf"):
            raise invalid_option(self, "weight_decay", "a number >= 0")
        if self.resync < 1:
            raise invalid_option(self, "resync", "an integer >= 1")
        if self.warmup_epochs < 0:
            raise invalid_option(self, "warmup_epochs", "an integer >= 0")
        if self.clip is not None and not 0 < self.clip < float("inf"):
            raise invalid_option(self, "clip", "a number > 0")
        return self


def sparse(values: torch.Tensor, indices: torch.Tensor, numel: int) -> SparseMessage:
    """The wire's sparse message of `values` at flat `indices` (int32, fp32)."""
    return SparseMessage(indices.to(INDEX_DTYPE), values.float(), numel)


class SparseApplyRule:
    """The server of `gd` and `dgc`: W ← W − s for each pushed sparse update s (and, with
    `weight_decay`, W ← W − lr·wd·W, DGC's uncompressed decay); answer the dense W."""

    def __init__(self, weights: torch.Tensor, lr: float, weight_decay: float = 0.0):
        self.weights = weights.detach().clone().float()
        self.lr, self.weight_decay = lr, weight_decay
        self.updates = 0  # pushes applied, all workers together

    def pull(self, worker: int) -> torch.Tensor:
        return self.weights

    def push(self, worker: int, update) -> torch.Tensor:
        self.apply(update)
        return self.weights

    def apply(self, update) -> None:
        if not isinstance(update, SparseMessage) or update.numel != self.weights.numel():
            shown = (f"a sparse update of length {update.numel}"
                     if isinstance(update, SparseMessage) else f"a {type(update).__name__}")
            raise ValueError(f"expected a sparse update of length {self.weights.numel()}, "
                             f"got {shown}")
        if not bool(torch.isfinite(update.values).all()):
            raise ValueError("the pushed update has non-finite values")
        if self.weight_decay:
            self.weights.mul_(1 - self.lr * self.weight_decay)
        self.weights.index_add_(0, update.indices.long(), update.values.to(self.weights.dtype),
                                alpha=-1)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.clone(), "lr": self.lr,
                "weight_decay": self.weight_decay, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"].clone()
        self.lr, self.weight_decay = float(state["lr"]), float(state["weight_decay"])
        self.updates = int(state["updates"])


class SparseAsyncSGD(Mode):
    """The worker side (see the module docstring); a subclass names its memory and selector
    and may schedule the density."""

    control = ControlPath.STORE
    Options = SparseOptions
    memory_name: ClassVar[str] = "residual"
    selector_name: ClassVar[str] = "topk"
    default_density: ClassVar[float] = 0.01
    default_momentum: ClassVar[float] = 0.0

    def __init__(self, model, optimizer, comm, options: SparseOptions | None = None):
        super().__init__(model, optimizer, comm, options)
        self.options.validate()
        group = optimizer.param_groups[0]
        self.momentum = (self.options.momentum if self.options.momentum is not None
                         else group.get("momentum") or self.default_momentum)
        self.layout = Layout.of(self.parameters())
        self.memory = memory(self.memory_name, self.layout.numel, momentum=self.momentum,
                             weight_decay=self.options.weight_decay)
        self.selector = selector(self.selector_name, self.layout)
        self.epoch = 0
        self.sent = 0  # non-zeros pushed so far

    @classmethod
    def check_optimizer(cls, optimizer: torch.optim.Optimizer) -> None:
        """The worker's memory applies SGD (its rate and momentum); the server adds."""
        if type(optimizer) is not torch.optim.SGD:
            raise ValueError(
                f"mode {cls.name!r} applies SGD (its learning rate and momentum go into the "
                f"worker's error-feedback memory); {optimizer_settings(optimizer)} cannot be "
                f"applied: use torch.optim.SGD(params, lr=..., momentum=...)")

    @property
    def base_density(self) -> float:
        return self.options.density if self.options.density is not None else self.default_density

    def density(self) -> float:
        """The fraction of each layer sent this step."""
        return self.base_density

    def setup(self) -> None:
        if self.comm.ps_client is None:
            raise ValueError(f"mode {self.name!r} needs a parameter server")
        with self.comm.clock.phase("comm"):
            self._receive(self.comm.ps_client.pull())

    def decide(self, step: Step) -> Action:
        self.epoch = step.epoch
        return Action.PUSH

    def apply(self, action: Action) -> None:
        params = self.parameters()
        grad = self._clipped(flatten(gradients(params)).float().cpu())
        weights = flatten(params).float().cpu()
        candidate = self.memory.accumulate(grad, weights, self.lr)
        indices = self.selector.select(candidate, self.density())
        update = sparse(self.memory.take(indices), indices, self.layout.numel)
        self.sent += update.nnz
        with self.comm.clock.phase("comm"):
            reply = self.comm.ps_client.push_pull(update, rate=self.lr)  # (weight decay's)
        self._receive(reply, weights)

    def finish(self) -> None:
        """Take the server's weights (after every worker's last push, under hetsync.wrap's
        agreed stop), then say goodbye."""
        with self.comm.clock.phase("comm"):
            self._receive(self.comm.ps_client.pull())
        super().finish()

    def _clipped(self, grad: torch.Tensor) -> torch.Tensor:
        return grad

    def _receive(self, reply, weights: torch.Tensor | None = None) -> None:
        """Dense weights replace the model; a sparse difference is added to it."""
        params = self.parameters()
        if isinstance(reply, SparseMessage):
            weights = flatten(params).float().cpu() if weights is None else weights
            weights.index_add_(0, reply.indices.long(), reply.values.to(weights.dtype))
            reply = weights
        unflatten_into(reply.to(params[0].device), params)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "memory": self.memory.state_dict(), "sent": self.sent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.memory.load_state_dict(state["memory"])
        self.sent = int(state["sent"])

    def describe(self) -> dict[str, Any]:
        return {"memory": self.memory_name, "selector": self.selector_name,
                "momentum": self.momentum, "layers": len(self.layout.sizes)}
