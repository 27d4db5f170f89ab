"""The global update of a local-step mode: how workers' deltas are weighted, and the outer
optimizer that applies their combination to the global model.

A round ends with worker i holding Δ_i = w_i − w_global after τ_i local steps. One all-reduce
carries every worker's `contribution`; `combine` turns the sum into one delta D; the
`OuterOptimizer` applies it.

Weightings:

- ``uniform``: D = mean Δ_i (ESync);
- ``samples``: D = Σ τ_i·Δ_i / Σ τ_i (each sample counts once, whoever processed it);
- ``fednova``: D = τ_eff · Σ p_i·Δ_i/τ_i with p_i = 1/P and τ_eff = Σ p_i·τ_i (FedNova, Wang
  et al., NeurIPS 2020: normalised averaging removes the pull towards fast workers' data that
  plain averaging of unequal local steps converges to).

Outer optimizer (DiLoCo, Douillard et al. 2023, which found Nesterov best): the combined delta
is a negative pseudo-gradient; with momentum μ > 0, b ← μ·b + D (b ← D at first, as
`torch.optim.SGD`), w_global ← w_global + lr·(D + μ·b); with μ = 0, w_global ← w_global +
lr·D, which with lr 1 and ``uniform`` is ESync's own update, computed identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

WEIGHTINGS = ("uniform", "samples", "fednova")


def contribution(delta: torch.Tensor, steps: int, weighting: str) -> torch.Tensor:
    """What worker i adds to the round's all-reduce: its weighted delta, then τ_i."""
    tau = torch.tensor([float(steps)], dtype=delta.dtype)
    if weighting == "uniform":
        return torch.cat([delta, tau])
    if weighting == "samples":
        return torch.cat([delta * steps, tau])
    if weighting == "fednova":  # (no steps: a worker that has joined sends zeros)
        return torch.cat([delta / steps if steps else delta * 0, tau])
    raise ValueError(f"unknown weighting {weighting!r}; expected one of {', '.join(WEIGHTINGS)}")


def combine(summed: torch.Tensor, workers: int, weighting: str) -> tuple[torch.Tensor, float]:
    """(vector, scale) with D = scale · vector, from the sum of every worker's
    `contribution` (kept apart so that ``uniform`` scales the sum exactly as ESync did)."""
    vector, total_steps = summed[:-1], float(summed[-1])
    if weighting == "uniform":
        return vector, 1.0 / workers
    if weighting == "samples":
        return vector, 1.0 / total_steps
    if weighting == "fednova":
        return vector, (total_steps / workers) / workers
    raise ValueError(f"unknown weighting {weighting!r}; expected one of {', '.join(WEIGHTINGS)}")


@dataclass
class OuterOptimizer:
    """SGD with optional Nesterov momentum on the combined delta (see the module docstring).
    Each round's sum is one step, also when it is applied a round late (ESync's overlap): the
    momentum sees every round once."""

    lr: float = 1.0
    momentum: float = 0.0
    buffer: torch.Tensor | None = None

    def step(self, weights: torch.Tensor, vector: torch.Tensor, scale: float) -> None:
        """w ← w + lr·(D + μ·b), D = scale·vector, in place."""
        if self.momentum == 0:
            weights.add_(vector, alpha=self.lr * scale)
            return
        delta = vector * scale
        if self.buffer is None:
            self.buffer = delta.clone()
        else:
            self.buffer.mul_(self.momentum).add_(delta)
        weights.add_(delta + self.momentum * self.buffer, alpha=self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum,
                "buffer": None if self.buffer is None else self.buffer.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.buffer = None if state["buffer"] is None else state["buffer"].clone()
