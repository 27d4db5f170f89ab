"""The global update of a local-step mode: how workers' deltas are weighted, and the outer
optimizer that applies their combination to the global model.

A round ends with worker i holding Δ_i = w_i − w_global after τ_i local steps. One all-reduce
carries every worker's `contribution`; `combine` turns the sum into one delta D; the
outer optimizer applies it (`outer_step`).

Weightings:

- ``uniform``: D = mean Δ_i (ESync);
- ``samples``: D = Σ τ_i·Δ_i / Σ τ_i (each sample counts once, whoever processed it; where
  batches differ, `--balanced-batches`, τ_i is steps × the worker's `sample_weight`, each
  step on a lost worker's shard at that shard's batch);
- ``fednova``: D = τ_eff · Σ p_i·Δ_i/τ_i with p_i = 1/P and τ_eff = Σ p_i·τ_i (FedNova, Wang
  et al., NeurIPS 2020: normalised averaging removes the pull towards fast workers' data that
  plain averaging of unequal local steps converges to).

Outer optimizer (DiLoCo, Douillard et al. 2023, which found Nesterov best; torchft's
`DiLoCo` takes one the same way): a real `torch.optim.SGD` over the flat global weights,
stepped on the pseudo-gradient g = −D (w_global less the workers' combination). With momentum
μ > 0 it is Nesterov's SGD: b ← μ·b + g (b ← g at first), w_global ← w_global − lr·(g + μ·b);
with μ = 0, w_global ← w_global + lr·D, which with lr 1 and ``uniform`` is ESync's own update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

WEIGHTINGS = ("uniform", "samples", "fednova")


@dataclass
class OuterOptions:
    """The outer step's options, shared by the modes that have one (each mode's own default
    where not given: `ModeSpec.defaults`)."""

    global_lr: float | None = field(default=None, metadata={
        "flags": ("-gl", "--global-lr"),
        "help": "global (outer) learning rate on the combined weight delta"})
    outer_momentum: float | None = field(default=None, metadata={
        "flags": ("--outer-momentum",),
        "help": "Nesterov momentum of the global update"})

    def validate_outer(self) -> None:
        from hetsync.options import invalid_option

        if self.global_lr is not None and not 0 < self.global_lr < float("inf"):
            raise invalid_option(self, "global_lr", "a finite number > 0")
        if self.outer_momentum is not None and not 0 <= self.outer_momentum < 1:
            raise invalid_option(self, "outer_momentum", "a number in [0, 1)")


@dataclass
class WeightingOptions:
    """How a mode with rounds of local steps combines the workers' deltas (`combine`)."""

    weighting: str | None = field(default=None, metadata={
        "flags": ("--weighting",),
        "help": "how the workers' deltas combine: uniform (the mean), samples (by local "
                "steps, times the batch where batches differ: each sample once), fednova "
                "(normalised averaging; for non-IID data) (default: uniform; samples with "
                "--balanced-batches)"})

    def validate_weighting(self) -> None:
        from hetsync.options import invalid_option

        if self.weighting is not None and self.weighting not in WEIGHTINGS:
            raise invalid_option(self, "weighting", " or ".join(WEIGHTINGS))


def contribution(delta: torch.Tensor, steps: int, weighting: str,
                 samples: float | None = None) -> torch.Tensor:
    """What worker i adds to the round's all-reduce: its weighted delta, then τ_i (for
    ``samples``, `samples`: the round's samples relative to the others' — its steps × its
    `CommContext.sample_weight`, a step on a held shard at that shard's batch; default
    `steps`)."""
    if weighting == "samples":
        tau = torch.tensor([float(steps if samples is None else samples)], dtype=delta.dtype,
                           device=delta.device)
        return torch.cat([delta * tau, tau])
    tau = torch.tensor([float(steps)], dtype=delta.dtype, device=delta.device)
    if weighting == "uniform":
        return torch.cat([delta, tau])
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


def outer_optimizer(weights: torch.Tensor, lr: float, momentum: float) -> torch.optim.SGD:
    """The outer optimizer over the flat global `weights` (a tensor the caller keeps and
    updates only in place): SGD at `lr`, with Nesterov momentum `momentum` if it is > 0."""
    return torch.optim.SGD([weights], lr=lr, momentum=momentum, nesterov=momentum > 0)


def outer_step(optimizer: torch.optim.Optimizer, delta: torch.Tensor) -> None:
    """One outer step on the combined delta D: the pseudo-gradient is −D. Each round's sum is
    one step, also when it is applied a round late (ESync's overlap): the momentum sees every
    round once."""
    (weights,) = optimizer.param_groups[0]["params"]
    weights.grad = -delta.to(weights)
    optimizer.step()
    weights.grad = None


def momentum_buffer(optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """The outer optimizer's momentum buffer b (None before its first step, or without
    momentum)."""
    (weights,) = optimizer.param_groups[0]["params"]
    return optimizer.state.get(weights, {}).get("momentum_buffer")


def set_momentum_buffer(optimizer: torch.optim.Optimizer, buffer: torch.Tensor | None) -> None:
    """Set b (after a regroup every survivor takes rank 0's); None: as before a first step."""
    (weights,) = optimizer.param_groups[0]["params"]
    optimizer.state.pop(weights, None)
    if buffer is not None:
        optimizer.state[weights]["momentum_buffer"] = buffer.clone()


def describe_outer(optimizer: torch.optim.Optimizer) -> str:
    """e.g. "Nesterov lr 0.7 momentum 0.9", or "SGD lr 1"."""
    group = optimizer.param_groups[0]
    if group["momentum"]:
        return f"Nesterov lr {group['lr']:g} momentum {group['momentum']:g}"
    return f"SGD lr {group['lr']:g}"
