"""The local learning rate over a run: a factor of each parameter group's starting rate,
from the run's progress toward its stopping rule.

``cosine``: factor = f + (1 − f)·(1 + cos πp)/2 for progress p ∈ [0, 1] (SGDR's annealing,
Loshchilov & Hutter, ICLR 2017, without restarts), f = ``--lr-final``. Progress is training
time over ``--time-budget`` (evaluation excluded, so deferring it changes nothing), else
samples over ``--epochs``; with both, whichever stops the run first. Every worker computes
its own from the same clock and the agreed sample count, so no message carries it.

The starting rate is kept in each group's ``initial_lr``, as torch's schedulers do: it is
saved with the optimizer's state, so a resumed run decays from the same start.
"""

from __future__ import annotations

import math

import torch


def lr_factor(schedule: str, progress: float, final: float) -> float:
    """The rate's factor at `progress` (clamped to [0, 1])."""
    p = min(max(progress, 0.0), 1.0)
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected constant or cosine")


def run_progress(train_time: float, samples_seen: int, *, time_budget: float | None,
                 epochs: float | None, train_size: int) -> float:
    """How far the run is toward its stopping rule, in [0, 1] (0 without one)."""
    parts = []
    if time_budget is not None:
        parts.append(train_time / time_budget)
    if epochs is not None:
        parts.append(samples_seen / (epochs * train_size))
    return min(max(parts, default=0.0), 1.0)


def set_lr_factor(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Every group's rate to `factor` × its starting rate."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor
