"""Which torch device a process of the run computes on."""

from __future__ import annotations

import os
import sys

import torch

from hetsync._version import __version__
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


def build_info() -> dict:
    """What a run's numbers were computed with, for its `run.json`: the versions, and what
    decides torch's CPU kernels (the CPU capability it dispatches on and its threads). A
    virtual run's records are the same to the bit where these are; on another CPU torch's
    kernels sum in another order, and the same seed trains another model."""
    return {"hetsync_version": __version__, "torch_version": torch.__version__,
            "python": sys.version.split()[0],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads()}
