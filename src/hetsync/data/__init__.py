"""Data for hetsync: IDX reader, data sets (Fashion-MNIST, CIFAR-10, Shakespeare, synthetic),
partitioners over workers and a per-worker batch sampler.

Typical use by a worker of rank ``r`` among ``P``::

    split = load_dataset("fashion-mnist", data_dir)
    shards = partition("iid", split.train.labels, P, seed)
    sampler = ShardSampler(shards[r], batch_size=64, seed=seed + r)
    for epoch, idx in sampler:
        x, y = split.train.batch(idx)
"""

from .arrays import ArrayDataset, DataSplit
from .datasets import DATASETS, load_dataset
from .errors import DataFormatError, DataNotFoundError, IdxFormatError, UnsafePickleError
from .idx import read_idx, write_idx
from .partition import (PARTITIONS, class_partition, dirichlet_partition, group_partition,
                        iid_partition, partition, shared_partition)
from .sampler import ShardSampler

__all__ = [
    "ArrayDataset",
    "DataSplit",
    "DATASETS",
    "load_dataset",
    "DataFormatError",
    "DataNotFoundError",
    "IdxFormatError",
    "UnsafePickleError",
    "read_idx",
    "write_idx",
    "PARTITIONS",
    "iid_partition",
    "shared_partition",
    "class_partition",
    "group_partition",
    "dirichlet_partition",
    "partition",
    "ShardSampler",
]
