"""Mini-batches over one worker's shard, reproducible per (seed, epoch)."""

from __future__ import annotations

import itertools
import operator
from typing import Iterator, Union

import numpy as np
import torch

__all__ = ["ShardSampler"]


class ShardSampler:
    """Batches of sample indices from one shard, epoch after epoch.

    ``epoch(e)`` permutes the shard with a generator seeded from ``(seed, e)``
    (``numpy.random.SeedSequence([seed, e])``), so any epoch can be recomputed on its own and
    every run with the same seed sees the same batches. With ``shuffle=False`` the shard is
    walked in its given order every epoch (ESync's ``-s 1``: fixed order, no shuffling).
    ``drop_last=True`` drops the final short batch (so every step has ``batch_size`` samples);
    with ``drop_last=False`` the last batch may be smaller.

    Give each worker a different ``seed`` (e.g. base seed + rank) if their orders should be
    independent, as they must be with the ``shared`` partition, where every shard is the
    whole set.
    """

    def __init__(
        self,
        indices: Union[np.ndarray, torch.Tensor],
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
        if idx.size == 0:
            raise ValueError("indices is empty: a worker needs at least one sample")
        try:
            bs = operator.index(batch_size)
        except TypeError:
            raise ValueError(f"batch_size must be an integer, got {batch_size!r}") from None
        if bs < 1:
            raise ValueError(f"batch_size must be at least 1, got {bs}")
        if drop_last and bs > idx.size:
            raise ValueError(
                f"batch_size={bs} is larger than the shard ({idx.size} samples); with drop_last "
                "no batch would ever be produced"
            )
        seed = operator.index(seed)
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.indices = idx.astype(np.int64, copy=True)
        self.batch_size = bs
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)

    def __repr__(self) -> str:
        return (
            f"ShardSampler({len(self.indices)} samples, batch_size={self.batch_size}, seed={self.seed}, "
            f"shuffle={self.shuffle}, drop_last={self.drop_last})"
        )

    @property
    def num_samples(self) -> int:
        """Size of the shard."""
        return len(self.indices)

    @property
    def batches_per_epoch(self) -> int:
        """⌊n/b⌋ with ``drop_last``, else ⌈n/b⌉."""
        n, b = len(self.indices), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def epoch(self, e: int) -> list[np.ndarray]:
        """The batches (int64 index arrays) of epoch ``e`` (≥ 0), in order."""
        e = operator.index(e)
        if e < 0:
            raise ValueError(f"epoch must be non-negative, got {e}")
        order = self.indices.copy()  # callers may modify the batches they get
        if self.shuffle:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, e]))
            order = order[rng.permutation(len(order))]
        b = self.batch_size
        return [order[i * b : (i + 1) * b] for i in range(self.batches_per_epoch)]

    def resume_at(self, epoch: int, batch: int) -> None:
        """Make the next iteration start at batch ``batch`` of epoch ``epoch`` (a checkpoint's
        data position: the batches before it were already trained on)."""
        if epoch < 0 or batch < 0:
            raise ValueError(f"position must be non-negative, got epoch {epoch} batch {batch}")
        self.start = (int(epoch), int(batch))

    start: tuple[int, int] = (0, 0)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(epoch, batch_indices)`` forever: epoch 0's batches, then epoch 1's, ...
        (from ``start``)."""
        first, skip = self.start
        for e in itertools.count(first):
            for batch in self.epoch(e)[skip if e == first else 0:]:
                yield e, batch
