"""Fashion-MNIST from its four IDX files (gzip or raw)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .arrays import ArrayDataset, DataSplit
from .errors import IdxFormatError
from .idx import read_idx
from .locate import find_data_dir, first_existing, missing_reason

__all__ = ["FILES", "MEAN", "STD", "load_fashion_mnist"]

#: role -> base file name (``.gz`` preferred, raw accepted).
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
MEAN = (0.2860,)
STD = (0.3530,)
NUM_CLASSES = 10
SUBDIR = "fashion-mnist"

HOW_TO_GET = (
    "To get it: on Debian/Ubuntu run `apt-get install dataset-fashion-mnist` (installs into "
    "/usr/share/datasets/fashion-mnist/), or put the four files "
    + ", ".join(f"{b}.gz" for b in FILES.values())
    + " into DIR/fashion-mnist/ and pass `-dd DIR` (or set HETSYNC_DATA=DIR)."
)


def _file(folder: str, base: str) -> Optional[str]:
    return first_existing(folder, (base + ".gz", base))


def _probe(folder: str) -> Optional[str]:
    return missing_reason(folder, {f"{b}(.gz)": (b + ".gz", b) for b in FILES.values()})


def _load_pair(images_path: str, labels_path: str) -> ArrayDataset:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise IdxFormatError(
            f"{images_path}: expected N×28×28 uint8 images, found shape {images.shape} {images.dtype}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise IdxFormatError(f"{labels_path}: expected N uint8 labels, found shape {labels.shape} {labels.dtype}")
    if len(images) != len(labels):
        raise IdxFormatError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels; "
            "expected equal counts"
        )
    if len(images) == 0:
        raise IdxFormatError(f"{images_path}: holds 0 images; expected at least 1")
    if int(labels.max()) >= NUM_CLASSES:
        raise IdxFormatError(
            f"{labels_path}: labels must be < {NUM_CLASSES}, found {int(labels.max())}"
        )
    return ArrayDataset(
        images=torch.from_numpy(images).unsqueeze(1),
        labels=torch.from_numpy(labels.astype(np.int64)),
        mean=MEAN,
        std=STD,
    )


def load_fashion_mnist(data_dir: Optional[str] = None) -> DataSplit:
    """Load Fashion-MNIST (60000 train / 10000 test, 1×28×28, 10 classes).

    Searched as described in :mod:`hetsync.data.locate` (``data_dir/fashion-mnist/`` first,
    as ESync's ``-dd``). Unlike ESync (MXNet, which downloads on a hash mismatch), nothing is
    ever downloaded: the files are validated (IDX structure, 28×28 uint8 images, uint8
    labels < 10, equal counts, at least one image) and any problem raises
    :class:`IdxFormatError`.
    """
    folder = find_data_dir("fashion-mnist", SUBDIR, data_dir, _probe, HOW_TO_GET)
    p = {role: _file(folder, base) for role, base in FILES.items()}
    train = _load_pair(p["train_images"], p["train_labels"])
    test = _load_pair(p["test_images"], p["test_labels"])
    return DataSplit("fashion-mnist", train, test, (1, 28, 28), NUM_CLASSES)
