"""`fedbuff`: buffered asynchronous aggregation (Nguyen et al., "Federated Learning with
Buffered Asynchronous Aggregation", AISTATS 2022).

Each worker runs rounds of H local steps and pushes its pseudo-gradient as soon as they are
done, without waiting for the others (`async_rounds`). The server, at model version t:

1. takes each arriving delta Δ_k = w_k − w_received_k (the negative pseudo-gradient) weighted
   by its staleness τ_k = t − the version worker k last received: s(τ) = 1/√(1 + τ), as the
   paper's experiments; adds s(τ_k)·Δ_k to its buffer;
2. after K arrivals (`--buffer-size`) steps the global weights with the outer optimizer
   (`outer.outer_optimizer`: SGD at the server rate η_g, `-gl`, default 1, no momentum unless
   `--outer-momentum`) on D = buffer / K, empties the buffer, and t ← t + 1;
3. answers every push with the current weights at once (the worker does not wait for the
   buffer to fill).

hetsync departs from the paper in that the clients are a fixed set of always-available
workers (no client sampling), each running H steps of the run's local optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.async_rounds import PUSH_EXTRA, AsyncLocalRounds, reply
from hetsync.algorithms.diloco import InnerStepsOptions
from hetsync.algorithms.local_rounds import global_update
from hetsync.algorithms.outer import OuterOptions, outer_optimizer, outer_step
from hetsync.algorithms.registry import ModeSpec, register


@dataclass
class FedBuffOptions(InnerStepsOptions, OuterOptions):
    """Options of `fedbuff`."""

    buffer_size: int = field(default=2, metadata={
        "flags": ("--buffer-size",),
        "help": "K: deltas buffered per server step"})

    def validate(self) -> "FedBuffOptions":
        from hetsync.options import invalid_option

        self.validate_outer()
        self.validate_inner()
        if not 1 <= self.buffer_size <= 1_000_000:
            raise invalid_option(self, "buffer_size", "an integer in 1..1000000")
        return self


DEFAULTS = {"global_lr": 1.0, "outer_momentum": 0.0}


def staleness_weight(staleness: int) -> float:
    """s(τ) = 1/√(1 + τ)."""
    return 1.0 / math.sqrt(1 + staleness)


class BufferedRule:
    """The server side (see the module docstring)."""

    def __init__(self, weights: torch.Tensor, lr: float, momentum: float, buffer_size: int,
                 inner_steps: int):
        if buffer_size < 1 or inner_steps < 1:
            raise ValueError(f"buffer_size and inner_steps must be >= 1, got {buffer_size}, "
                             f"{inner_steps}")
        self.weights = weights.detach().clone().float()
        self.outer = outer_optimizer(self.weights, lr, momentum)
        self.buffer_size, self.inner_steps = buffer_size, inner_steps
        self.buffer = torch.zeros_like(self.weights)
        self.buffered = 0
        self.version = 0
        self.received: dict[int, int] = {}  # worker -> the version it last received

    def pull(self, worker: int) -> torch.Tensor:
        self.received[worker] = self.version
        return self.weights

    def push(self, worker: int, payload: torch.Tensor) -> torch.Tensor:
        delta = -payload[:-PUSH_EXTRA].to(self.weights.dtype)
        staleness = self.version - self.received.get(worker, self.version)
        self.buffer.add_(delta, alpha=staleness_weight(staleness))
        self.buffered += 1
        if self.buffered == self.buffer_size:
            outer_step(self.outer, self.buffer / self.buffer_size)
            self.buffer.zero_()
            self.buffered = 0
            self.version += 1
        self.received[worker] = self.version
        return reply(self.weights, self.inner_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.clone(), "outer": self.outer.state_dict(),
                "buffer": self.buffer.clone(), "buffered": self.buffered,
                "version": self.version, "received": dict(self.received)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights.copy_(state["weights"])
        self.outer.load_state_dict(state["outer"])
        self.buffer = state["buffer"].clone()
        self.buffered, self.version = int(state["buffered"]), int(state["version"])
        self.received = {int(k): int(v) for k, v in state["received"].items()}


def server_rule(weights, lr, options: FedBuffOptions, layout, workers: int) -> BufferedRule:
    settings = global_update(DEFAULTS, options)
    return BufferedRule(weights, settings["global_lr"], settings["outer_momentum"],
                        options.buffer_size, options.inner_steps)


class FedBuff(AsyncLocalRounds):
    name = "fedbuff"
    Options = FedBuffOptions


register(ModeSpec("fedbuff", FedBuff, "H local steps, pushed as soon as done; the parameter "
                  "server steps on every K buffered deltas, weighted by staleness (FedBuff)",
                  options=FedBuffOptions, server_rule=server_rule, parameter_server=True,
                  push_extra=PUSH_EXTRA, lr_note="local rate, server {global_lr:g}",
                  defaults=DEFAULTS))
