"""Partitioners (sizes, disjointness, coverage, class structure, determinism) and ShardSampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetsync.data import (
    PARTITIONS,
    ShardSampler,
    class_partition, group_partition,
    dirichlet_partition,
    iid_partition,
    partition,
    shared_partition,
)


def balanced_labels(n=1000, classes=10, seed=0):
    return np.random.default_rng(seed).permutation(np.arange(n) % classes)


def assert_disjoint_sorted_int64(shards):
    for s in shards:
        assert s.dtype == np.int64 and s.ndim == 1
        assert np.all(np.diff(s) > 0)  # sorted, no repeats
    allidx = np.concatenate(shards)
    assert len(np.unique(allidx)) == len(allidx)


# --------------------------------------------------------------------------- iid


@pytest.mark.parametrize("n,p", [(60000, 6), (1003, 4), (10, 10), (7, 1)])
def test_iid_equal_shards_remainder_dropped(n, p):
    shards = iid_partition(n, p, seed=1)
    assert len(shards) == p
    assert all(len(s) == n // p for s in shards)
    assert_disjoint_sorted_int64(shards)
    allidx = np.concatenate(shards)
    assert allidx.min() >= 0 and allidx.max() < n
    assert len(allidx) == n - n % p


def test_iid_is_random_and_seeded():
    a = iid_partition(1000, 4, seed=7)
    b = iid_partition(1000, 4, seed=7)
    c = iid_partition(1000, 4, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert not np.array_equal(a[0], np.arange(250))  # not ESync's contiguous block


def test_iid_shards_see_all_classes():
    y = balanced_labels(6000)
    for s in partition("iid", y, 6, seed=0):
        counts = np.bincount(y[s], minlength=10)
        assert counts.min() > 60  # ~100 each


def test_by_batch_shards_are_disjoint_random_and_sized_by_each_workers_batch():
    """Balanced batches of devices 1, 2, 4, 8 times slower: every worker ends its epoch after
    as many steps as the others (each shard's samples over its batch are the same)."""
    batches = [64, 32, 16, 8]
    shards = partition("by-batch", balanced_labels(60000), 4, seed=3, batches=batches)
    assert_disjoint_sorted_int64(shards)
    assert [len(s) for s in shards] == [32000, 16000, 8000, 4000]
    assert len({len(s) // b for s, b in zip(shards, batches)}) == 1
    assert not np.array_equal(shards[0], iid_partition(60000, 4, seed=4, batches=batches)[0])
    # equal batches: the iid shards themselves
    assert all(np.array_equal(a, b) for a, b in zip(
        iid_partition(1003, 4, seed=1, batches=[5] * 4), iid_partition(1003, 4, seed=1)))
    for bad in ([64, 32, 16], [64, 0, 16, 8]):
        with pytest.raises(ValueError, match=r"batches must be 4 positive integers, one per "
                           r"worker, got \[64, "):
            iid_partition(60000, 4, seed=0, batches=bad)
    with pytest.raises(ValueError, match="'by-batch' needs each of the 4 workers' batch"):
        partition("by-batch", balanced_labels(100), 4, seed=0)


def test_shared_gives_every_worker_the_whole_set():
    shards = partition("shared", balanced_labels(100), 4, seed=0)
    assert len(shards) == 4
    assert all(s.dtype == np.int64 and np.array_equal(s, np.arange(100)) for s in shards)
    with pytest.raises(ValueError, match="num_workers=4"):
        shared_partition(3, 4)


# --------------------------------------------------------------------------- class (-s 1)


@pytest.mark.parametrize("p", [1, 3, 6, 10, 20])
def test_class_partition_contiguous_class_ranges(p):
    y = balanced_labels(6000)
    shards = class_partition(y, p)
    assert len(shards) == p and all(len(s) == 6000 // p for s in shards)
    assert_disjoint_sorted_int64(shards)
    prev_max = -1
    for s in shards:
        classes = np.unique(y[s])
        assert np.array_equal(classes, np.arange(classes[0], classes[-1] + 1))  # contiguous range
        assert classes[0] >= prev_max  # ranges follow each other (may share a boundary class)
        prev_max = classes[-1]


def test_class_partition_matches_esync_with_six_workers():
    y = balanced_labels(60000)
    shards = class_partition(torch.from_numpy(y), 6)  # tensors accepted
    classes = [np.unique(y[s]).tolist() for s in shards]
    assert classes == [[0, 1], [1, 2, 3], [3, 4], [5, 6], [6, 7, 8], [8, 9]]
    # Stable sort: within a class, file order is kept; worker 0 gets all of class 0 first.
    assert np.array_equal(shards[0][np.isin(shards[0], np.flatnonzero(y == 0))], np.flatnonzero(y == 0))


def test_class_partition_unbalanced_drops_only_the_tail():
    y = np.array([2, 0, 1, 0, 2, 2, 1])  # 7 samples, 3 workers -> 2 each, one dropped
    shards = class_partition(y, 3)
    assert [y[s].tolist() for s in shards] == [[0, 0], [1, 1], [2, 2]]
    assert len(np.concatenate(shards)) == 6


def test_class_partition_is_deterministic():
    y = balanced_labels(500)
    assert all(np.array_equal(a, b) for a, b in zip(class_partition(y, 4), class_partition(y.copy(), 4)))


# --------------------------------------------------------------------------- dirichlet


def classes_per_worker(y, shards, share=0.05):
    """Number of classes that make up at least ``share`` of each worker's samples."""
    return [int((np.bincount(y[s], minlength=10) / len(s) >= share).sum()) for s in shards]


def test_dirichlet_covers_every_sample_exactly_once():
    y = balanced_labels(3000)
    for alpha in (0.05, 0.5, 5.0):
        shards = dirichlet_partition(y, 8, alpha, seed=2)
        assert len(shards) == 8 and all(len(s) > 0 for s in shards)
        assert_disjoint_sorted_int64(shards)
        assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(3000))


def test_dirichlet_small_alpha_is_skewed_large_alpha_uniform():
    y = balanced_labels(10000)
    skewed = dirichlet_partition(y, 10, 0.05, seed=0)
    uniform = dirichlet_partition(y, 10, 1000.0, seed=0)
    assert np.mean(classes_per_worker(y, skewed)) < 4
    assert classes_per_worker(y, uniform) == [10] * 10
    # Large alpha: every worker's class histogram is near 10 % per class, sizes near N/P.
    for s in uniform:
        frac = np.bincount(y[s], minlength=10) / len(s)
        assert np.abs(frac - 0.1).max() < 0.02
        assert abs(len(s) - 1000) < 100


def test_dirichlet_never_leaves_a_worker_empty():
    y = balanced_labels(40)
    for seed in range(20):
        shards = dirichlet_partition(y, 30, 0.01, seed=seed)
        assert all(len(s) >= 1 for s in shards)
        assert len(np.concatenate(shards)) == 40
    shards = dirichlet_partition(np.zeros(5, dtype=np.int64), 5, 0.1, seed=0)  # N == P
    assert [len(s) for s in shards] == [1] * 5


def test_dirichlet_seeded():
    y = balanced_labels(2000)
    a = dirichlet_partition(y, 5, 0.3, seed=4)
    b = dirichlet_partition(y, 5, 0.3, seed=4)
    c = dirichlet_partition(y, 5, 0.3, seed=5)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))


# --------------------------------------------------------------------------- dispatch and errors


def test_partition_dispatch():
    y = balanced_labels(600)
    assert PARTITIONS == ("iid", "by-batch", "shared", "class", "group", "dirichlet")
    for got, want in [
        (partition("iid", y, 3, seed=1), iid_partition(600, 3, seed=1)),
        (partition("class", y, 3, seed=1), class_partition(y, 3)),
        (partition("group", y, 3, seed=1), group_partition(y, 3, seed=1)),
        (partition("dirichlet", y, 3, seed=1, alpha=0.2), dirichlet_partition(y, 3, 0.2, seed=1)),
    ]:
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError) as info:
        partition("noniid", y, 3, seed=1)
    assert "'noniid'" in str(info.value) and all(k in str(info.value) for k in PARTITIONS)


@pytest.mark.parametrize("kind", PARTITIONS)
def test_bad_worker_counts(kind):
    y = balanced_labels(10)
    with pytest.raises(ValueError, match="num_workers must be at least 1, got 0"):
        partition(kind, y, 0, seed=0, batches=[1])
    with pytest.raises(ValueError, match="num_workers=11.*10 samples"):
        partition(kind, y, 11, seed=0, batches=[1] * 11)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match=f"alpha.*{alpha}"):
        dirichlet_partition(balanced_labels(100), 2, alpha, seed=0)


def test_bad_labels():
    with pytest.raises(ValueError, match="1-D"):
        class_partition(np.zeros((2, 5), np.int64), 2)
    with pytest.raises(ValueError, match="integers"):
        class_partition(np.zeros(10, np.float32), 2)


# --------------------------------------------------------------------------- ShardSampler


def test_sampler_batches_cover_the_shard():
    shard = np.arange(100, 203)  # 103 samples
    s = ShardSampler(shard, batch_size=10, seed=0)
    assert s.batches_per_epoch == 10
    batches = s.epoch(0)
    assert len(batches) == 10 and all(len(b) == 10 and b.dtype == np.int64 for b in batches)
    got = np.concatenate(batches)
    assert len(np.unique(got)) == 100 and np.isin(got, shard).all()
    keep = ShardSampler(shard, batch_size=10, seed=0, drop_last=False)
    assert keep.batches_per_epoch == 11
    b = keep.epoch(0)
    assert [len(x) for x in b] == [10] * 10 + [3]
    assert np.array_equal(np.sort(np.concatenate(b)), shard)


def test_sampler_reshuffles_per_epoch_reproducibly():
    shard = np.arange(64)
    a = ShardSampler(shard, 8, seed=3)
    b = ShardSampler(shard, 8, seed=3)
    e0, e1 = np.concatenate(a.epoch(0)), np.concatenate(a.epoch(1))
    assert not np.array_equal(e0, e1)  # a new order each epoch
    assert not np.array_equal(e0, shard)  # shuffled at all
    assert np.array_equal(np.sort(e0), np.sort(e1))  # same samples
    for e in (0, 1, 5):
        assert all(np.array_equal(x, y) for x, y in zip(a.epoch(e), b.epoch(e)))
    assert all(np.array_equal(x, y) for x, y in zip(a.epoch(1), a.epoch(1)))  # recomputable
    other = ShardSampler(shard, 8, seed=4)
    assert not np.array_equal(np.concatenate(other.epoch(0)), e0)


def test_sampler_without_shuffle_keeps_order_every_epoch():
    shard = np.array([5, 3, 9, 1, 7, 2])
    s = ShardSampler(shard, 2, seed=0, shuffle=False)
    assert [b.tolist() for b in s.epoch(0)] == [[5, 3], [9, 1], [7, 2]]
    assert [b.tolist() for b in s.epoch(4)] == [[5, 3], [9, 1], [7, 2]]
    s.epoch(0)[0][0] = -1  # returned batches are copies
    assert s.epoch(0)[0].tolist() == [5, 3]


def test_sampler_iterates_forever_with_epoch_numbers():
    s = ShardSampler(torch.arange(10), 4, seed=1)  # tensors accepted
    it = iter(s)
    got = [next(it) for _ in range(7)]
    assert [e for e, _ in got] == [0, 0, 1, 1, 2, 2, 3]
    assert all(np.array_equal(b, s.epoch(e)[i % 2]) for i, (e, b) in enumerate(got))


@pytest.mark.parametrize("bs", [0, -3])
def test_sampler_bad_batch_size(bs):
    with pytest.raises(ValueError, match=f"batch_size must be at least 1, got {bs}"):
        ShardSampler(np.arange(10), bs, seed=0)


def test_sampler_batch_larger_than_shard():
    with pytest.raises(ValueError, match="batch_size=11.*10 samples"):
        ShardSampler(np.arange(10), 11, seed=0)
    assert ShardSampler(np.arange(10), 11, seed=0, drop_last=False).batches_per_epoch == 1


def test_sampler_bad_indices():
    with pytest.raises(ValueError, match="empty"):
        ShardSampler(np.array([], np.int64), 1, seed=0)
    with pytest.raises(ValueError, match="1-D"):
        ShardSampler(np.zeros((2, 2), np.int64), 1, seed=0)
    with pytest.raises(ValueError, match="epoch must be non-negative"):
        ShardSampler(np.arange(4), 2, seed=0).epoch(-1)
