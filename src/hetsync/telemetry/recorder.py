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



def clean_json(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(clean_json(data), indent=2) + "\n")


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
        self._file.write(json.dumps(clean_json(record), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
