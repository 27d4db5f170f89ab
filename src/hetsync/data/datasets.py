"""``load_dataset``: one entry point for every data set hetsync knows."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from .arrays import DataSplit
from .cifar10 import load_cifar10
from .fashion_mnist import load_fashion_mnist
from .shakespeare import CONTEXT, load_shakespeare
from .synthetic import make_synthetic

__all__ = ["DATASETS", "load_dataset"]

#: Names :func:`load_dataset` accepts.
DATASETS = ("fashion-mnist", "cifar10", "shakespeare", "synthetic")
#: the data sets of text: samples of characters for a token model (gpt-char), judged by loss
TEXT_DATASETS = ("shakespeare",)


def load_dataset(
    name: str,
    data_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    seed: int = 0,
    synthetic_shape: Sequence[int] = (1, 28, 28),
    synthetic_size: Sequence[int] = (6000, 1000),
    context: int = CONTEXT,
) -> DataSplit:
    """Load data set ``name`` (one of :data:`DATASETS`).

    - ``"fashion-mnist"``: the four IDX files, searched in ``data_dir/fashion-mnist/``,
      ``data_dir/``, ``$HETSYNC_DATA/fashion-mnist/``, ``$HETSYNC_DATA/``,
      ``/usr/share/datasets/fashion-mnist/``.
    - ``"cifar10"``: the python batches, searched in ``data_dir/cifar-10-batches-py/``,
      ``data_dir/``, and the same under ``$HETSYNC_DATA``.
    - ``"shakespeare"``: the works' ``*_gut.txt`` texts, searched in ``data_dir/shakespeare/``,
      ``data_dir/``, the same under ``$HETSYNC_DATA``, and ``~/.local/share/hetsync/shakespeare/``
      (where ``scripts/setup.sh`` puts them); samples of ``context`` characters
      (:mod:`hetsync.data.shakespeare`).
    - ``"synthetic"``: generated from ``seed`` with ``synthetic_shape`` (C, H, W) and
      ``synthetic_size`` (train, test); ``data_dir`` is ignored.

    Raises ``ValueError`` for an unknown name, :class:`DataNotFoundError` when the files are
    nowhere (or a given ``data_dir`` does not exist), and :class:`DataFormatError`
    (:class:`IdxFormatError` for IDX files) when they are malformed. ``seed`` only affects
    the synthetic set.
    """
    dd = None if data_dir is None else os.fspath(data_dir)
    if name == "fashion-mnist":
        return load_fashion_mnist(dd)
    if name == "cifar10":
        return load_cifar10(dd)
    if name == "shakespeare":
        return load_shakespeare(dd, context)
    if name == "synthetic":
        return make_synthetic(seed, synthetic_shape, synthetic_size)
    raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
