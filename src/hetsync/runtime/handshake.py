"""Small agreements between processes at start-up, sent as UTF-8 in uint8 tensors (no pickle).

`broadcast_text` gives every rank rank 0's string (the run's name); `gather_texts` gives every
rank the strings of all ranks (host and device of each, for run.json). Both over the default
group, or over the workers that start the run where spares join later (`--spare-workers`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MAX_BYTES = 1024


def _encode(text: str) -> torch.Tensor:
    data = text.encode()
    if len(data) > MAX_BYTES - 2:
        raise ValueError(f"handshake text longer than {MAX_BYTES - 2} bytes: {text[:60]!r}...")
    buf = torch.zeros(MAX_BYTES, dtype=torch.uint8)
    buf[0], buf[1] = len(data) // 256, len(data) % 256
    buf[2:2 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf


def _decode(buf: torch.Tensor) -> str:
    n = int(buf[0]) * 256 + int(buf[1])
    return bytes(buf[2:2 + n].tolist()).decode()


def broadcast_text(text: str, src: int = 0, group=None) -> str:
    """Global rank `src`'s `text` on every rank of `group` (None: the default group)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return text
    buf = _encode(text)
    dist.broadcast(buf, src=src, group=group)
    return _decode(buf)


def gather_texts(text: str, group=None) -> list[str]:
    """Every rank's `text`, in `group`'s order of ranks (None: the default group)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [text]
    bufs = [torch.zeros(MAX_BYTES, dtype=torch.uint8) for _ in range(dist.get_world_size(group))]
    dist.all_gather(bufs, _encode(text), group=group)
    return [_decode(b) for b in bufs]
