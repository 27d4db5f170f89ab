"""Character-level text: a corpus of named works cut into fixed-length windows.

A sample is a window of ``context + 1`` consecutive characters of one work: its first
``context`` are the input and its last ``context`` the targets (each character's successor),
as nanoGPT's ``get_batch`` takes them. Windows start every ``context`` characters and never
cross from one work into the next, so every character of a work is a target at most once per
pass, and the window's work is its "label": the partitioners split by it (``class``, ``group``,
``dirichlet``: whole plays, or shares of them, per worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np
import torch

__all__ = ["Vocabulary", "TextDataset", "windows"]

Indices = Union[np.ndarray, torch.Tensor, Sequence[int]]


@dataclass(frozen=True)
class Vocabulary:
    """The characters of the training text, sorted, after index 0, which stands for any
    character the training text lacks (a held-out work may use one)."""

    chars: str
    UNKNOWN = 0

    @classmethod
    def of(cls, texts: Sequence[str]) -> "Vocabulary":
        return cls("".join(sorted(set().union(*map(set, texts)))))

    def __len__(self) -> int:
        return len(self.chars) + 1

    def encode(self, text: str) -> tuple[np.ndarray, int]:
        """The token ids of `text` and how many of its characters are unknown."""
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        known = [ord(c) for c in self.chars]
        lookup = np.zeros(max([int(codes.max(initial=0))] + known) + 1, np.int64)
        lookup[known] = np.arange(1, len(known) + 1)
        ids = lookup[codes]
        return ids.astype(np.uint8 if len(self) <= 256 else np.int16), int((ids == 0).sum())

    def decode(self, ids: Sequence[int]) -> str:
        return "".join("\ufffd" if i == self.UNKNOWN else self.chars[i - 1] for i in ids)


def windows(lengths: Sequence[int], context: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, work) of every window of ``context + 1`` characters in works of these
    lengths laid end to end: one every ``context`` characters, none crossing a work's end."""
    starts, work, offset = [], [], 0
    for w, n in enumerate(lengths):
        s = offset + np.arange(0, max(n - context, 0), context, dtype=np.int64)
        starts.append(s)
        work.append(np.full(len(s), w, np.int64))
        offset += n
    return np.concatenate(starts), np.concatenate(work)


@dataclass(frozen=True, eq=False)
class TextDataset:
    """Windows over ``tokens`` (the works' token ids end to end, one 1-D tensor).

    ``batch(indices)`` returns ``(x, y)``, both int64 ``B × context``: ``y`` is ``x`` shifted
    by one character. ``labels[i]`` is window i's work; ``works`` names them.
    """

    tokens: torch.Tensor
    starts: torch.Tensor
    labels: torch.Tensor
    context: int
    works: tuple[str, ...]
    _offsets: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.starts.dim() != 1 or len(self.starts) != len(self.labels):
            raise ValueError("TextDataset: tokens must be 1-D and starts and labels of one length")
        if len(self.starts) and int(self.starts.max()) + self.context + 1 > len(self.tokens):
            raise ValueError("TextDataset: a window runs past the end of the tokens")
        object.__setattr__(self, "_offsets", torch.arange(self.context + 1))

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(np.asarray(indices) if not isinstance(indices, torch.Tensor)
                              else indices).to(torch.int64)
        if idx.dim() != 1:
            raise ValueError(f"TextDataset.batch: indices must be 1-D, got shape {tuple(idx.shape)}")
        chunk = self.tokens[self.starts.index_select(0, idx)[:, None] + self._offsets].long()
        return chunk[:, :-1], chunk[:, 1:]
