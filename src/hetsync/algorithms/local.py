"""`local`: plain SGD on one device — the sequential-SGD reference ("standalone" in ESync)."""

from __future__ import annotations

import torch

from hetsync.algorithms.base import Algorithm


class LocalSGD(Algorithm):
    """Every step is a local update; a round is one step; nothing is communicated."""

    name = "local"
    collective_control = False

    def local_step(self) -> None:
        self.optimizer.step()

    def synchronize(self, control: torch.Tensor | None = None) -> None:
        self.round += 1
