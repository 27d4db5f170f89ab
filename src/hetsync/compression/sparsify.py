"""Which coordinates of a flat vector to send: per-layer top-ρ, exact or by a sampled threshold.

A model travels as one flat vector (`hetsync.algorithms.base.flatten`); :class:`Layout` says
where each layer (parameter tensor) lies in it. Both selectors pick per layer, at least one
element each (as DGS, gradient dropping and DGC do), and return sorted int64 flat indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass(frozen=True)
class Layout:
    """The sizes of the layers laid end to end in a flat vector."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.sizes):
            raise ValueError(f"layer sizes must be >= 1, got {self.sizes}")

    @classmethod
    def of(cls, tensors) -> "Layout":
        return cls(tuple(int(t.numel()) for t in tensors))

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def spans(self):
        """(start, end) of each layer."""
        start = 0
        for n in self.sizes:
            yield start, start + n
            start += n


def layer_k(numel: int, density: float) -> int:
    """How many of a layer's `numel` elements a density keeps: ⌊numel·density⌋, at least 1."""
    return min(numel, max(1, math.floor(numel * density)))


class TopK:
    """Exact per-layer top-k by magnitude.

    `transport`: what can carry the selection. Top-k sets differ from worker to worker, so
    they cannot be summed by an all-reduce; they go to a parameter server (or an all-gather).
    """

    transport: ClassVar[str] = "sparse"

    def __init__(self, layout: Layout):
        self.layout = layout

    def select(self, vector: torch.Tensor, density: float) -> torch.Tensor:
        """Sorted flat indices of the kept coordinates of `vector`."""
        if vector.numel() != self.layout.numel:
            raise ValueError(f"vector has {vector.numel()} elements, the layout "
                             f"{self.layout.numel}")
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        picked = [start + self._layer(vector[start:end].abs(), layer_k(end - start, density))
                  for start, end in self.layout.spans()]
        return torch.cat(picked).sort().values

    def _layer(self, magnitude: torch.Tensor, k: int) -> torch.Tensor:
        return torch.topk(magnitude, k, sorted=False).indices


class SampledTopK(TopK):
    """DGC's selection (Lin et al., ICLR'18, as its authors' code runs it): per layer,

    1. the threshold is the k_s-th largest magnitude of a 1 % strided sample (k_s in proportion
       to k, at least 1);
    2. keep every element at or above it; while the count is outside 0.8–1.3 × k, move the
       threshold (×1.3 up, ×0.8 down), at most 10 times;
    3. if it is still outside, fall back to the exact top-k.

    Cheaper than an exact top-k on large layers; the count may differ from k by the margins.
    """

    sample_fraction = 0.01
    bounds = (0.8, 1.3)
    adaptations = 10

    def _layer(self, magnitude: torch.Tensor, k: int) -> torch.Tensor:
        n = magnitude.numel()
        stride = max(1, round(1 / self.sample_fraction))
        sample = magnitude[::stride]
        if sample.numel() == n:  # a small layer: the sample is the layer
            return super()._layer(magnitude, k)
        k_sample = max(1, math.ceil(k * sample.numel() / n))
        threshold = torch.topk(sample, k_sample, sorted=False).values.min()
        low, high = self.bounds
        for _ in range(self.adaptations + 1):
            picked = torch.nonzero(magnitude >= threshold).view(-1)
            if low * k <= picked.numel() <= high * k:
                return picked
            threshold = threshold * (high if picked.numel() > high * k else low)
        return super()._layer(magnitude, k)
