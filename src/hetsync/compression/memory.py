"""Error-feedback memories: what a worker keeps of what it did not send.

A memory works on flat fp32 vectors and never communicates. Per step:

1. ``candidate = memory.accumulate(grad, weights, lr)``: fold the step's gradient in and return
   the vector the selector picks from (`hetsync.compression.sparsify`);
2. ``values = memory.take(indices)``: the values to send at the picked coordinates, the
   memory updated for having sent them.

After `take`, the values sent (scattered to their coordinates) plus what the memory keeps for
the next step equal the candidate, coordinate by coordinate — nothing is lost but what a
method discards on purpose (DGC's momentum at the sent coordinates).

Weight decay `wd` is folded into the gradient where the method's published code does (gradient
dropping, DGS); DGC keeps it out of the compressed vector.
"""

from __future__ import annotations

from typing import Any

import torch


class Memory:
    """The interface (see the module docstring)."""

    def __init__(self, numel: int, *, momentum: float = 0.0, weight_decay: float = 0.0):
        self.numel, self.momentum, self.weight_decay = numel, momentum, weight_decay

    def accumulate(self, grad: torch.Tensor, weights: torch.Tensor, lr: float) -> torch.Tensor:
        raise NotImplementedError

    def take(self, indices: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in vars(self).items() if isinstance(v, torch.Tensor)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            getattr(self, k).copy_(v)


class ResidualMemory(Memory):
    """Gradient dropping (Aji & Heafield, EMNLP'17, as DGS's code runs its baseline):
    v ← v + lr·(g + wd·w); send v at the picked coordinates and zero them there; no momentum."""

    def __init__(self, numel: int, **kw):
        super().__init__(numel, **kw)
        self.residual = torch.zeros(numel)

    def accumulate(self, grad, weights, lr):
        self.residual.add_(grad + self.weight_decay * weights, alpha=lr)
        return self.residual

    def take(self, indices):
        values = self.residual[indices].clone()
        self.residual[indices] = 0
        return values


class MomentumCorrection(Memory):
    """DGC's momentum correction and momentum-factor masking (Lin et al., ICLR'18):
    u ← m·u + g; v ← v + u; send lr·v at the picked coordinates; zero u and v there.

    The rate is applied when sending, as DGS's code does for this baseline, so that v holds
    gradients and a rate schedule acts on what leaves. Weight decay stays out (the server
    applies it densely)."""

    def __init__(self, numel: int, **kw):
        super().__init__(numel, **kw)
        self.velocity = torch.zeros(numel)
        self.accumulated = torch.zeros(numel)
        self._lr = 0.0

    def accumulate(self, grad, weights, lr):
        self.velocity.mul_(self.momentum).add_(grad)
        self.accumulated.add_(self.velocity)
        self._lr = lr
        return self.accumulated

    def take(self, indices):
        values = self.accumulated[indices] * self._lr
        self.accumulated[indices] = 0
        self.velocity[indices] = 0  # momentum-factor masking
        return values


class SAMomentum(Memory):
    """DGS's SAMomentum (Yan et al., ICPP'20): u ← m·u + lr·(g + wd·w); send u at the picked
    coordinates; divide the unsent ones by m, so that the next m·u leaves them undecayed (they
    accumulate like a larger batch) while the sent ones keep their momentum."""

    def __init__(self, numel: int, **kw):
        super().__init__(numel, **kw)
        if not 0 < self.momentum < 1:
            raise ValueError(f"SAMomentum needs a momentum in (0, 1), got {self.momentum}")
        self.velocity = torch.zeros(numel)

    def accumulate(self, grad, weights, lr):
        self.velocity.mul_(self.momentum).add_(grad + self.weight_decay * weights, alpha=lr)
        return self.velocity

    def take(self, indices):
        values = self.velocity[indices].clone()
        unsent = torch.ones(self.numel, dtype=torch.bool)
        unsent[indices] = False
        self.velocity[unsent] /= self.momentum
        return values
