"""Writing a run directory so that a crash never corrupts it.

Records are appended as one JSON line each and flushed at once: a process that dies leaves at
most one partial last line, which the reader skips. Whole-file documents (run.json, summaries)
are written to a temporary file and renamed over the old one, which is atomic on POSIX.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(_clean(data), indent=2) + "\n")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `path` whole or not at all (a temporary file beside it, synced, then renamed)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class JsonlWriter:
    """Appends one JSON object per line to `path`, flushed per record."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def recount_samples_seen(run_dir: str | Path) -> None:
    """Restamp each evaluation's `samples_seen` of a finished run from the workers' records:
    the samples of every round that ended by the evaluation's time `t`.

    For the modes whose count goes through the store (no common round: the asynchronous
    ones) on a virtual clock: there the leader reads the store when the real machine gets to
    it, so its count depends on the machine's speed while every other field is the clocks'."""
    from hetsync.telemetry.runlog import read_run

    log = read_run(run_dir)
    ends = [(float(r["t_end"]), int(r["samples"])) for records in log.workers.values()
            for r in records]
    path = Path(run_dir) / "eval.jsonl"
    if not path.is_file():
        return
    evals = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in evals:  # (the leader's own round ends exactly at `t`)
        record["samples_seen"] = sum(n for t, n in ends if t <= record["t"] + 1e-9)
    write_text_atomic(path, "".join(json.dumps(_clean(r), separators=(",", ":")) + "\n"
                                    for r in evals))
