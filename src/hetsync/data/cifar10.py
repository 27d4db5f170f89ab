"""CIFAR-10 from the standard "python version" batches (``cifar-10-batches-py``)."""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

from .arrays import ArrayDataset, DataSplit
from .errors import DataFormatError
from .locate import find_data_dir, missing_reason
from .safe_pickle import safe_load

__all__ = ["TRAIN_BATCHES", "TEST_BATCH", "MEAN", "STD", "load_cifar10", "read_batch"]

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
NUM_CLASSES = 10
SUBDIR = "cifar-10-batches-py"
_PIXELS = 3 * 32 * 32

HOW_TO_GET = (
    "To get it: unpack the CIFAR-10 python version (cifar-10-python.tar.gz) so that "
    "DIR/cifar-10-batches-py/ holds data_batch_1..5 and test_batch, then pass `-dd DIR` "
    "(or set HETSYNC_DATA=DIR)."
)


def _probe(folder: str) -> Optional[str]:
    return missing_reason(folder, {b: (b,) for b in TRAIN_BATCHES + (TEST_BATCH,)})


def _get(d: dict, key: str, path: str) -> Any:
    for k in (key.encode(), key):  # Python 2 pickles have bytes keys, Python 3 ones str keys
        if k in d:
            return d[k]
    raise DataFormatError(f"{path}: batch dict has no {key!r} entry; found keys {sorted(map(repr, d))}")


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 batch file: ``(images uint8 n×3×32×32, labels int64 n)``.

    The file is unpickled with :func:`~hetsync.data.safe_pickle.safe_load` (numpy arrays and
    plain containers only). Raises :class:`DataFormatError` naming the file when the dict
    lacks ``data``/``labels``, ``data`` is not uint8 n×3072, the label count differs from n,
    or a label is outside 0..9.
    """
    d = safe_load(path)
    if not isinstance(d, dict):
        raise DataFormatError(f"{path}: expected a dict with 'data' and 'labels', found {type(d).__name__}")
    data = np.asarray(_get(d, "data", path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise DataFormatError(
            f"{path}: expected 'data' uint8 of shape (n, {_PIXELS}), found {data.dtype} {data.shape}"
        )
    try:
        labels = np.asarray(_get(d, "labels", path))
        if labels.size and not np.issubdtype(labels.dtype, np.integer):
            raise TypeError(f"found {labels.dtype}")
        labels = labels.astype(np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise DataFormatError(f"{path}: 'labels' is not a list of integers: {e}") from e
    if labels.ndim != 1 or len(labels) != len(data):
        raise DataFormatError(
            f"{path}: 'data' has {len(data)} images but 'labels' has shape {labels.shape}; expected {len(data)} labels"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataFormatError(
            f"{path}: labels must be in 0..{NUM_CLASSES - 1}, found {labels.min()}..{labels.max()}"
        )
    # Rows are channel-major: 1024 red, 1024 green, 1024 blue, each row-major 32×32.
    return data.reshape(-1, 3, 32, 32), labels


def _dataset(paths: list[str]) -> ArrayDataset:
    parts = [read_batch(p) for p in paths]
    if not sum(len(p[1]) for p in parts):
        raise DataFormatError(f"{', '.join(paths)}: hold 0 images; expected at least 1")
    images = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0].copy()
    labels = np.concatenate([p[1] for p in parts])
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels), MEAN, STD)


def load_cifar10(data_dir: Optional[str] = None) -> DataSplit:
    """Load CIFAR-10 (50000 train / 10000 test, 3×32×32, 10 classes; fewer if the batches hold
    fewer images). Searched as described in :mod:`hetsync.data.locate`. Nothing is downloaded.
    """
    folder = find_data_dir("cifar10", SUBDIR, data_dir, _probe, HOW_TO_GET)
    train = _dataset([os.path.join(folder, b) for b in TRAIN_BATCHES])
    test = _dataset([os.path.join(folder, TEST_BATCH)])
    return DataSplit("cifar10", train, test, (3, 32, 32), NUM_CLASSES)
