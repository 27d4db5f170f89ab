"""`async-local-sgd`: asynchronous local SGD with delayed Nesterov momentum and dynamic local
updates (Liu et al., "Asynchronous Local-SGD Training for Language Modeling", 2024).

Each worker runs rounds of local steps and pushes its pseudo-gradient to the parameter server
as soon as they are done, without waiting for the others (`async_rounds`). The server:

1. Delayed Nesterov (DN): with g_t the t-th pseudo-gradient to arrive, the momentum m changes
   only every N arrivals (N = `--momentum-every`, default the number of workers); between
   them each g_t is applied alone, w ← w − (lr/N)·g_t; at every N-th,
   m ← μ·m + ḡ (ḡ: the mean of the N since the last change) and w ← w − lr·(g_t/N + μ·m).
   Over N arrivals from the same weights this is one step of Nesterov's SGD on their mean —
   DiLoCo's outer step (lr 0.7, μ 0.9).
2. Dynamic local updates (DyLU): from each push's step time, the worker's next round is
   H·c_fastest/c_i steps (`async_rounds.dynamic_steps`): the fastest takes H, the others as
   many as fit in the same time.

hetsync departs from the paper in the form of step 1's in-between updates, which the paper
scales by a constant c; here c = 1/N, the scale that makes N arrivals one synchronous outer
step (our reading, stated so it can be checked: `tests/test_async_local.py`). DyLU rounds
H·c_fastest/c_i to the nearest integer (the paper's floor under measured times gives the 2×
slower worker 3 steps of 8 as often as 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.async_rounds import PUSH_EXTRA, AsyncLocalRounds, dynamic_steps, reply
from hetsync.algorithms.diloco import InnerStepsOptions
from hetsync.algorithms.local_rounds import global_update
from hetsync.algorithms.outer import OuterOptions
from hetsync.algorithms.registry import ModeSpec, register


@dataclass
class AsyncLocalOptions(InnerStepsOptions, OuterOptions):
    """Options of `async-local-sgd`."""

    momentum_every: int = field(default=0, metadata={
        "flags": ("--momentum-every",),
        "help": "N: arrivals between changes of the delayed Nesterov momentum (0: the number "
                "of workers)"})
    dynamic_steps: bool = field(default=True, metadata={
        "flags": ("--dynamic-steps",),
        "help": "DyLU: each worker's local steps in proportion to its measured speed, H for "
                "the fastest (0/1; 0: H for every worker) (default: 1)"})

    def validate(self) -> "AsyncLocalOptions":
        from hetsync.options import invalid_option

        self.validate_outer()
        self.validate_inner()
        if not 0 <= self.momentum_every <= 1_000_000:
            raise invalid_option(self, "momentum_every", "an integer in 1..1000000, or 0 (the "
                                 "number of workers)")
        return self


DEFAULTS = {"global_lr": 0.7, "outer_momentum": 0.9}


class DelayedNesterovRule:
    """The server side: delayed Nesterov over the arriving pseudo-gradients, DyLU's round
    lengths in the answers (see the module docstring)."""

    def __init__(self, weights: torch.Tensor, lr: float, momentum: float, every: int,
                 inner_steps: int, dynamic: bool = True):
        if not (lr > 0 and 0 <= momentum < 1 and every >= 1 and inner_steps >= 1):
            raise ValueError(f"delayed Nesterov needs lr > 0, momentum in [0, 1), every >= 1 "
                             f"and inner_steps >= 1; got {lr}, {momentum}, {every}, "
                             f"{inner_steps}")
        self.weights = weights.detach().clone().float()
        self.lr, self.momentum, self.every = lr, momentum, every
        self.inner_steps, self.dynamic = inner_steps, dynamic
        self.buffer = torch.zeros_like(self.weights)       # m
        self.accumulated = torch.zeros_like(self.weights)  # Σ g since m last changed
        self.arrivals = 0
        self.step_times: dict[int, float] = {}

    def pull(self, worker: int) -> torch.Tensor:
        return self.weights

    def push(self, worker: int, payload: torch.Tensor) -> torch.Tensor:
        g = payload[:-PUSH_EXTRA].to(self.weights.dtype)
        self.step_times[worker] = float(payload[-1])
        self.accumulated.add_(g)
        self.arrivals += 1
        if self.arrivals % self.every == 0:
            self.buffer.mul_(self.momentum).add_(self.accumulated, alpha=1 / self.every)
            self.accumulated.zero_()
            self.weights.add_(g / self.every + self.momentum * self.buffer, alpha=-self.lr)
        else:
            self.weights.add_(g, alpha=-self.lr / self.every)
        steps = (dynamic_steps(self.inner_steps, self.step_times, worker) if self.dynamic
                 else self.inner_steps)
        return reply(self.weights, steps)

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.clone(), "buffer": self.buffer.clone(),
                "accumulated": self.accumulated.clone(), "arrivals": self.arrivals,
                "step_times": dict(self.step_times)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"].clone()
        self.buffer, self.accumulated = state["buffer"].clone(), state["accumulated"].clone()
        self.arrivals = int(state["arrivals"])
        self.step_times = {int(k): float(v) for k, v in state["step_times"].items()}


def server_rule(weights, lr, options: AsyncLocalOptions, layout, workers: int):
    settings = global_update(DEFAULTS, options)
    return DelayedNesterovRule(weights, settings["global_lr"], settings["outer_momentum"],
                               options.momentum_every or workers, options.inner_steps,
                               options.dynamic_steps)


class AsyncLocalSGD(AsyncLocalRounds):
    name = "async-local-sgd"
    Options = AsyncLocalOptions


register(ModeSpec("async-local-sgd", AsyncLocalSGD, "local steps in proportion to each "
                  "worker's speed, pushed as soon as done; the parameter server applies "
                  "delayed Nesterov (asynchronous local SGD)", options=AsyncLocalOptions,
                  server_rule=server_rule, parameter_server=True, push_extra=PUSH_EXTRA,
                  lr_note="inner rate, outer {global_lr:g}", defaults=DEFAULTS))
