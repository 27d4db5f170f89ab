"""Find the processes of a launched run, and read its records while it runs, for the tests
that kill or count them."""

from __future__ import annotations

import json
import os
from pathlib import Path


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def pid_of(run_dir: Path, name: str) -> int | None:
    """The running process `name` (rank-R, ps, state-server, evaluator) of the run in
    `run_dir`, or in a run directory under it, as launch names its processes in
    logs/pids.json; None where it is not running."""
    for pids in [Path(run_dir) / "logs" / "pids.json", *Path(run_dir).glob("*/logs/pids.json")]:
        try:
            pid = json.loads(pids.read_text()).get(name)
        except (OSError, ValueError):
            continue
        if pid is not None and running(pid):
            return pid
    return None


def pid_of_rank(run_dir: Path, rank: int) -> int | None:
    """The process of worker `rank` of the run in `run_dir`: launch's (`pid_of`), or one that
    torchrun started (its command line names the run directory, its environment the rank)."""
    pid = pid_of(run_dir, f"rank-{rank}")
    if pid is not None:
        return pid
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in cmd and str(run_dir).encode() in cmd and \
                f"RANK={rank}".encode() in env and running(int(entry)):
            return int(entry)
    return None


def live_records(path: Path) -> list[dict]:
    """The complete records of a JSON-lines file that a running process may be writing: a
    last line without its newline is a write in progress, not yet a record."""
    return [json.loads(line) for line in Path(path).read_text().split("\n")[:-1] if line]
