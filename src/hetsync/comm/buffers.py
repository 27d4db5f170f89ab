"""Reusable receive buffers, one cache per thread.

The collectives receive into a scratch buffer and add it in place. Allocating a fresh
buffer of tens of megabytes per call costs page faults comparable to the transfer, so each
thread keeps one buffer per (dtype, device), grown when a larger one is asked for.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()


def scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D buffer of at least ``numel`` elements (contents undefined), owned by this thread.

    The buffer is reused by the next call on the same thread: callers must be done with it
    before they call into another collective.
    """
    cache = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = {}
    key = (dtype, torch.device(device))
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
        cache[key] = buf
    return buf[:numel]


def clear() -> None:
    """Drop this thread's cached buffers."""
    _local.cache = {}
