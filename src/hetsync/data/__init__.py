"""Data for hetsync: IDX reader and data sets (Fashion-MNIST, CIFAR-10, synthetic)."""

from .arrays import ArrayDataset, DataSplit
from .datasets import DATASETS, load_dataset
from .errors import DataFormatError, DataNotFoundError, IdxFormatError, UnsafePickleError
from .idx import read_idx, write_idx

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
]
