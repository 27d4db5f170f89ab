"""The run directory: the names of its files, in one place, and its log of what happened.

A run's directory holds (who writes it):

=======================  =====================================================================
``config.json``          what the run was asked to do (`hetsync launch`, before any process)
``run.json``             the run: its config, versions, ranks, start and end (rank 0's
                         process, or `hetsync.wrap`'s leader; written whole, atomically)
``worker-{rank}.jsonl``  one record per round of each worker (`telemetry/runlog.py` reads them)
``eval.jsonl``           the evaluations (the leader, or `hetsync evaluate`)
``ps.jsonl``             the parameter server's traffic, work, refusals and losses
``service.json``         the counts of the mode's service (ESync's state server)
``events.jsonl``         what happened, one line each (`EVENTS_KINDS`): any process appends
``summary.json``         the summary of every record (`telemetry/summarize.py`; and
                         ``esync-summary.json``, ESync's figures, where asked for)
``logs/``                each process's output, and ``pids.json``: which process is which rank
``checkpoints/``         the checkpoints (`runtime/checkpoint.py`)
``figures/``             the figures (`telemetry/plots.py`)
=======================  =====================================================================

An event is one JSON line, ``{"t": unix seconds, "event": kind, ...}``, appended with one
`write` to the file opened ``O_APPEND`` (on a local file system each such write lands whole
at the end), so processes that append at once never interleave their lines; a reader skips
a line cut short by a crash, as it does every JSONL file's (`telemetry/runlog.py`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from hetsync.telemetry.recorder import write_json_atomic

CONFIG = "config.json"
RUN = "run.json"
EVAL = "eval.jsonl"
PS = "ps.jsonl"
SERVICE = "service.json"
EVENTS = "events.jsonl"
SUMMARY = "summary.json"
ESYNC_SUMMARY = "esync-summary.json"
LOGS = "logs"
PIDS = "pids.json"
CHECKPOINTS = "checkpoints"
FIGURES = "figures"
#: (before 2026-11-26 the state server's counts had this name)
OLD_SERVICE = "state-server.json"
#: a worker's records, by name (group 1: its rank)
WORKER_FILE = re.compile(r"^worker-(\d+)\.jsonl$")
#: the files that hold records, each written on one machine (`hetsync gather` copies them;
#: checkpoints and figures stay; `events.jsonl`, which every machine appends to, it merges)
RECORDS = re.compile(r"^(run\.json|eval\.jsonl|ps\.jsonl|service\.json|state-server\.json|"
                     r"config\.json|worker-\d+\.jsonl)$")

#: the kinds of event, and what each says
EVENTS_KINDS = {
    "resumed": "the run started again from a checkpoint (index, round, train_time)",
    "lost": "the run goes on without these workers (ranks, round, workers)",
    "lead": "a worker took the lead from a lost one (rank, lost)",
    "joined": "a worker's process joined the running job (rank, round, waited_s)",
    "offered": "the leader offered joining workers a place at a round (ranks, round)",
    "admitted": "the workers admitted joining ones (ranks, round, workers)",
    "exited": "launch saw a process end and the run go on (process, code, rejoins)",
    "restarted": "launch started processes again: the run, a service, spares (what, ...)",
    "fault": "a fault injected by HETSYNC_FAULT (rank, kind, round)",
    "replan": "the devices' speeds drifted: the balanced batches were re-planned (round, "
              "speeds, batches, before)",
    "slow_device": "a device ran below its nominal speed (rank, speed_of_nominal)",
    "overdue": "launch's watchdog stopped a run past its budget (running)",
    "diverged": "a worker's training loss was NaN or infinite: launch stopped the run "
                "(process)",
}


#: the console's lines of what happened (stderr where nothing configured `logging`)
log = logging.getLogger("hetsync")


def tell(run_dir: str | Path | None, kind: str, line: str, /, **fields: Any) -> None:
    """Say `line` on the console (`log`) and append the event `kind` with `fields` to
    `run_dir`'s events (none where `run_dir` is None: a loop that records nothing)."""
    log.warning(line)
    if run_dir is not None:
        RunDir(run_dir).event(kind, **fields)


def worker(rank: int) -> str:
    """The name of worker `rank`'s records."""
    return f"worker-{rank}.jsonl"


class RunDir:
    """A run directory's paths, and its events (`event`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def run(self) -> Path:
        return self.path / RUN

    @property
    def eval(self) -> Path:
        return self.path / EVAL

    @property
    def ps(self) -> Path:
        return self.path / PS

    @property
    def service(self) -> Path:
        return self.path / SERVICE

    @property
    def events(self) -> Path:
        return self.path / EVENTS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def esync_summary(self) -> Path:
        return self.path / ESYNC_SUMMARY

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def pids(self) -> Path:
        return self.path / LOGS / PIDS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def figures(self) -> Path:
        return self.path / FIGURES

    def worker(self, rank: int) -> Path:
        return self.path / worker(rank)

    def write_run(self, info: dict) -> None:
        """`run.json`, written whole or not at all: its one writer, for the worker's
        process and for `hetsync.wrap`'s leader alike."""
        write_json_atomic(self.run, info)

    def worker_files(self) -> list[Path]:
        """Every worker's records, by rank."""
        found = [(int(m.group(1)), p) for p in self.path.glob("worker-*.jsonl")
                 if (m := WORKER_FILE.match(p.name))]
        return [p for _, p in sorted(found)]

    def discard_attempt(self) -> None:
        """Remove what an attempt recorded (`RECORDS` but the config), so that the run starts
        again from its start: `launch`, when the run is stopped before its first checkpoint.
        The config, the events and the logs stay (launch removes the attempt's snapshots
        with `evaluation.drop_after`)."""
        for path in self.path.iterdir():
            if RECORDS.match(path.name) and path.name != CONFIG and path.is_file():
                path.unlink()

    def event(self, kind: str, /, **fields: Any) -> dict:
        """Append one event of `kind` (a key of `EVENTS_KINDS`) with `fields`; the record.
        Best effort where the directory is gone: an event never ends a run."""
        if kind not in EVENTS_KINDS:
            raise ValueError(f"unknown event {kind!r}; valid: {', '.join(EVENTS_KINDS)}")
        record = {"t": time.time(), "event": kind, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        try:
            fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return record
        try:
            os.write(fd, line)  # (one write of an O_APPEND file: lines never interleave)
        finally:
            os.close(fd)
        return record

    def read_events(self, kind: str | None = None) -> list[dict]:
        """The events so far (of `kind`, if given), oldest first; a cut last line skipped."""
        if not self.events.is_file():
            return []
        out = []
        for line in self.events.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # (a process died mid-line)
            if kind is None or record.get("event") == kind:
                out.append(record)
        return out
