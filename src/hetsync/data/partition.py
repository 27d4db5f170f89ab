"""Partitioners: split sample indices among workers (pure functions, seeded).

Every partitioner returns ``num_workers`` sorted int64 index arrays that are pairwise
disjoint (a sample belongs to at most one worker), except ``shared``, where every worker draws
from the whole set. They are pure: the same arguments give the same result on every machine
(``numpy.random.default_rng(seed)``), so each worker can compute the whole partition itself
and take its own shard, with no communication.
"""

from __future__ import annotations

import operator
from typing import Sequence, Union

import numpy as np
import torch

#: the kinds partition() accepts
PARTITIONS = ("iid", "by-batch", "shared", "class", "group", "dirichlet")

__all__ = ["PARTITIONS", "iid_partition", "shared_partition", "class_partition",
           "group_partition", "dirichlet_partition", "partition"]

Labels = Union[np.ndarray, torch.Tensor, Sequence[int]]


def _check_workers(num_workers: int, num_samples: int) -> int:
    try:
        p = operator.index(num_workers)
    except TypeError:
        raise ValueError(f"num_workers must be an integer, got {num_workers!r}") from None
    if p < 1:
        raise ValueError(f"num_workers must be at least 1, got {p}")
    if p > num_samples:
        raise ValueError(f"num_workers={p} is more than the {num_samples} samples to share; each worker needs at least one")
    return p


def _labels(labels: Labels) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    return arr


def iid_partition(num_samples: int, num_workers: int, seed: int,
                  batches: Sequence[int] | None = None) -> list[np.ndarray]:
    """Random disjoint shards: shuffle ``range(num_samples)`` with ``seed`` and cut it into
    ``num_workers`` shards of ⌊N/P⌋ samples; the N mod P left over are dropped. With
    ``batches`` (``--partition by-batch``), worker r's shard has ⌊N·b_r/Σb⌋ samples instead,
    so that every worker ends its epoch after as many steps as the others: under balanced
    batches (64, 32, 16, 8 for devices 1, 2, 4, 8 times slower) every sample is drawn once an
    epoch and as often as any other, where equal shards have the fastest device pass over its
    quarter eight times as often as the slowest over its own.

    ESync gives rank r the contiguous block [r·⌊N/P⌋, (r+1)·⌊N/P⌋) of the file order and
    also drops the remainder; hetsync draws the shards at random instead, so the split does
    not rely on the file being shuffled already (same shard sizes, same drop).
    """
    n = operator.index(num_samples)
    if n < 0:
        raise ValueError(f"num_samples must be non-negative, got {n}")
    p = _check_workers(num_workers, n)
    perm = np.random.default_rng(seed).permutation(n)
    if batches is None:
        sizes = [n // p] * p
    else:
        b = [operator.index(x) for x in batches]
        if len(b) != p or min(b) < 1:
            raise ValueError(f"batches must be {p} positive integers, one per worker, got "
                             f"{list(batches)}")
        sizes = [n * x // sum(b) for x in b]
    cuts = np.cumsum([0] + sizes)
    return [np.sort(perm[cuts[r]:cuts[r + 1]]).astype(np.int64) for r in range(p)]


def shared_partition(num_samples: int, num_workers: int) -> list[np.ndarray]:
    """Every worker draws from the whole set, each in its own shuffled order.

    With disjoint shards, a worker F times faster passes over its shard F times as often, so
    under ESync or asynchronous SGD the fast workers' samples weigh F times more in the model
    (1, 2, 4, 8: half of all steps come from the fastest worker's quarter of the data). Drawn
    from one shared set, every sample is as likely as any other whatever the speeds. It needs
    the whole data set on every machine. (On Fashion-MNIST's iid shards it made no difference
    to ESync's accuracy after 5 epochs: results/wall-clock-benches.md. Near LeNet's ceiling it
    did: `sync-lookahead` on balanced batches of 1, 2, 4, 8 reached 0.90 in 8 seeds of 10, not
    6, in 12.8 virtual s, not 14.0: results/virtual-claims.md.)
    """
    n = operator.index(num_samples)
    p = _check_workers(num_workers, n)
    return [np.arange(n, dtype=np.int64) for _ in range(p)]


def class_partition(labels: Labels, num_workers: int) -> list[np.ndarray]:
    """ESync's non-iid split (``-s 1``): sort the indices by class (stable, so within a class
    the file order is kept), then cut into ``num_workers`` contiguous blocks of ⌊N/P⌋; the
    N mod P left over (the tail of the highest class) are dropped.

    Each worker therefore sees a contiguous range of classes (about 10/P of them). There is no
    randomness. ESync also iterates these blocks in fixed order without shuffling; that is the
    sampler's ``shuffle=False``, chosen by the caller.
    """
    y = _labels(labels)
    n = len(y)
    p = _check_workers(num_workers, n)
    order = np.argsort(y, kind="stable").astype(np.int64)
    size = n // p
    return [np.sort(order[r * size : (r + 1) * size]) for r in range(p)]


def group_partition(labels: Labels, num_workers: int, seed: int) -> list[np.ndarray]:
    """Whole groups per worker: every sample of a label goes to one worker. For text the label
    is the work, so each worker reads its own plays (LEAF's natural non-IID split); for images
    it is the class.

    1. Shuffle the groups with ``seed`` (ties in size are broken differently per seed);
    2. largest first, give each group to the worker with the fewest samples so far (greedy
       longest-processing-time balancing: the largest share exceeds the smallest by at most
       the largest group).

    Needs at least as many groups as workers (else some worker would be empty), which is
    checked. Nothing is dropped.
    """
    y = _labels(labels)
    groups = np.unique(y)
    p = _check_workers(num_workers, len(y))
    if len(groups) < p:
        raise ValueError(f"num_workers={p} is more than the {len(groups)} groups to share; "
                         f"--partition group gives each worker whole groups")
    rng = np.random.default_rng(seed)
    groups = rng.permutation(groups)
    sizes = np.array([np.count_nonzero(y == g) for g in groups])
    load = np.zeros(p, np.int64)
    members: list[list[int]] = [[] for _ in range(p)]
    for k in np.argsort(-sizes, kind="stable"):
        r = int(np.argmin(load))
        members[r].append(groups[k])
        load[r] += sizes[k]
    return [np.flatnonzero(np.isin(y, m)).astype(np.int64) for m in members]


def dirichlet_partition(labels: Labels, num_workers: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label-skewed split: for each class, draw worker proportions q ~ Dirichlet(α·1_P) and
    give each worker that share of the class's (shuffled) samples.

    Guarantees: every sample is assigned to exactly one worker (nothing dropped), and no
    worker is empty. Small α (e.g. 0.1) gives each worker few classes; large α (e.g. 100)
    approaches the iid split. Not in ESync (its only non-iid mode is ``-s 1``).

    Empty workers are repaired deterministically rather than by resampling (which can loop
    for a long time when α is small and P large): while some worker is empty, it receives one
    random sample moved from the currently largest worker. This needs N ≥ P, which is checked.
    """
    y = _labels(labels)
    n = len(y)
    p = _check_workers(num_workers, n)
    a = float(alpha)
    if not a > 0 or not np.isfinite(a):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    rng = np.random.default_rng(seed)
    shards: list[list[np.ndarray]] = [[] for _ in range(p)]
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        q = rng.dirichlet(np.full(p, a))
        cuts = np.round(np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
        for r, part in enumerate(np.split(idx, cuts)):
            shards[r].append(part)
    out = [np.concatenate(s).astype(np.int64) if s else np.empty(0, np.int64) for s in shards]
    for r in range(p):
        if len(out[r]) == 0:
            donor = max(range(p), key=lambda i: len(out[i]))
            k = int(rng.integers(len(out[donor])))
            out[r] = out[donor][k : k + 1].copy()
            out[donor] = np.delete(out[donor], k)
    return [np.sort(s) for s in out]


def partition(kind: str, labels: Labels, num_workers: int, seed: int, alpha: float = 0.5,
              batches: Sequence[int] | None = None) -> list[np.ndarray]:
    """Dispatch on ``kind``: ``"iid"`` → :func:`iid_partition`, ``"by-batch"`` → the same
    sized by ``batches`` (each worker's), and ``"shared"`` → :func:`shared_partition` over
    ``len(labels)`` samples, ``"class"`` → :func:`class_partition`, ``"group"`` →
    :func:`group_partition`, ``"dirichlet"`` → :func:`dirichlet_partition` with ``alpha``."""
    if kind == "iid":
        return iid_partition(len(_labels(labels)), num_workers, seed)
    if kind == "by-batch":
        n = len(_labels(labels))
        p = _check_workers(num_workers, n)
        if batches is None:
            raise ValueError(f"partition 'by-batch' needs each of the {p} workers' batch "
                             f"(batches=...)")
        return iid_partition(n, p, seed, batches)
    if kind == "shared":
        return shared_partition(len(_labels(labels)), num_workers)
    if kind == "class":
        return class_partition(labels, num_workers)
    if kind == "group":
        return group_partition(labels, num_workers, seed)
    if kind == "dirichlet":
        return dirichlet_partition(labels, num_workers, alpha, seed)
    raise ValueError(f"unknown partition kind {kind!r}; expected one of {', '.join(PARTITIONS)}")
