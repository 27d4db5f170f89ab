"""Data injection for non-IID partitions (SelSync, Tyagi & Swany, CLUSTER'23).

A worker whose shard holds only some classes sees, every step, a few samples of the others
too. Per step, on top of its own batch of b samples:

1. draw ⌈α·C⌉ classes among those its shard lacks (C classes in all; all of them when fewer
   are missing), without replacement, from the worker's own seeded generator;
2. add ⌊β·b·P/C⌋ samples of each, drawn at random from the worker's own copy of the training
   set (every hetsync process holds the whole set: nothing crosses the network).

Defaults α = β = 0.25, as the paper's scripts. The injected samples are trained on, so they
count in the samples a worker trained (throughput, `--epochs`). The published code cannot run this path: it
looks up label −1 (initialised once, never redrawn) and slices with a float; with CIFAR-100,
b = 32 and P = 10 its formula gives 0 samples. hetsync implements the intent: fresh foreign
classes every step, integer counts, and at least one sample of each class drawn.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import numpy as np


def injection_counts(classes: int, batch_size: int, workers: int, alpha: float,
                     beta: float) -> tuple[int, int]:
    """(foreign classes per step, samples of each): ⌈α·C⌉ and max(1, ⌊β·b·P/C⌋)."""
    if not (0 < alpha <= 1 and 0 < beta <= 1):
        raise ValueError(f"alpha and beta must be in (0, 1], got {alpha}, {beta}")
    return math.ceil(alpha * classes), max(1, math.floor(beta * batch_size * workers / classes))


class InjectingSampler:
    """Wraps a sampler of ``(epoch, indices)``: each batch gains foreign-class samples."""

    def __init__(self, sampler: Iterable[tuple[int, np.ndarray]], labels: np.ndarray,
                 shard: np.ndarray, *, batch_size: int, workers: int, alpha: float = 0.25,
                 beta: float = 0.25, seed: int = 0):
        labels = np.asarray(labels)
        self.sampler = sampler
        classes = int(labels.max()) + 1 if labels.size else 0
        own = set(np.unique(labels[np.asarray(shard)]).tolist())
        self.foreign = [c for c in range(classes) if c not in own]
        self.by_class = {c: np.flatnonzero(labels == c) for c in self.foreign}
        self.classes_per_step, self.per_class = injection_counts(
            classes, batch_size, workers, alpha, beta)
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1A7EC7]))

    def extra(self) -> np.ndarray:
        """One step's injected indices (empty when the shard lacks no class)."""
        if not self.foreign:
            return np.zeros(0, dtype=np.int64)
        k = min(self.classes_per_step, len(self.foreign))
        chosen = self.rng.choice(self.foreign, size=k, replace=False)
        return np.concatenate([self.rng.choice(self.by_class[c], size=self.per_class)
                               for c in chosen]).astype(np.int64)

    def resume_at(self, epoch: int, batch: int) -> None:
        self.sampler.resume_at(epoch, batch)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        for epoch, idx in self.sampler:
            yield epoch, np.concatenate([idx, self.extra()])
