"""Which torch device a process of the run computes on."""

from __future__ import annotations

import os

import torch

from hetsync.config import Config
from hetsync.options import ConfigError


def pick_device(cfg: Config, local_rank: int = 0) -> torch.device:
    """CPU unless -g names a GPU (and -c does not force the CPU)."""
    if cfg.cpu or cfg.gpu < 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"-g/--gpu {cfg.gpu}: no CUDA device is available here; "
                          f"use -g -1 (CPU) or -c 1")
    index = cfg.gpu + (local_rank if os.environ.get("HETSYNC_GPU_PER_LOCAL_RANK") else 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"-g/--gpu {cfg.gpu}: only {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)
