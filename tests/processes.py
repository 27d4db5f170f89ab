"""Find the worker processes of a launched run, for the tests that kill or count them."""

from __future__ import annotations

import os
from pathlib import Path


def pid_of_rank(run_dir: Path, rank: int) -> int | None:
    """The process of `rank` of the run writing into `run_dir` (its environment says RANK)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in cmd and str(run_dir).encode() in cmd and f"RANK={rank}".encode() in env:
            return int(pid)
    return None
