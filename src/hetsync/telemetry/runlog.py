"""Reading a run directory (the files the workers and servers write; see docs/design.md).

A run directory holds:

- ``run.json``: the run's config, versions, start/end time, world size and per-rank
  ``{rank, host, device, slowdown}`` (``end_time``/``wall_s`` are missing after a crash);
- ``worker-{rank}.jsonl``: one record per round (``ROUND_FIELDS``: ``round, local_steps,
  samples, t_start, t_end, compute_s, wait_s, comm_s, bytes_sent, bytes_recv, loss, lr``
  and, when written, ``eval_s``, ``query_s``, the data ledger's ``drawn``,
  ``epoch_batches`` and ``held``), and the fields the mode adds (`Mode.round_record`);
- ``eval.jsonl``: ``t, train_time, round, samples_seen, test_acc, test_loss``;
- ``ps.jsonl`` (optional): the parameter server's ``{t, bytes_sent, bytes_recv, busy_s,
  requests}`` (busy_s: real seconds it spent serving);
- ``service.json`` (optional): the counts of the service the mode declares, ``{service,
  bytes_sent, bytes_recv, requests, ...}`` (ESync's state server adds ``lost, last_round``:
  by rank, the last round its run had a report of).

A process that crashed may leave its last JSONL line half written: that line is skipped with a
:class:`RunLogWarning`. Any other unreadable line is an error (:class:`RunLogError`) naming the
file and the line number, because silently dropping records would falsify every figure.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsync.telemetry.rundir import OLD_SERVICE, SERVICE, WORKER_FILE, RunDir

#: the fields of every round record (`runtime/rounds.py`'s `RoundAccount.record`); any other
#: is one the mode adds (`Mode.round_record`)
ROUND_FIELDS = frozenset({
    "rank", "device", "round", "local_steps", "samples", "t_start", "t_end", "compute_s",
    "wait_s", "comm_s", "query_s", "eval_s", "bytes_sent", "bytes_recv", "loss", "lr",
    "epoch", "drawn", "epoch_batches", "held"})

__all__ = [
    "RunLog",
    "RunLogError",
    "RunLogWarning",
    "read_jsonl",
    "read_run",
    "WORKER_FIELDS",
    "EVAL_FIELDS",
]

#: Fields every worker record must carry (``eval_s``/``query_s``/``loss``/``lr`` are optional).
WORKER_FIELDS = (
    "round", "local_steps", "samples", "t_start", "t_end",
    "compute_s", "wait_s", "comm_s", "bytes_sent", "bytes_recv",
)
#: Fields every evaluation record must carry.
EVAL_FIELDS = ("t", "train_time", "test_acc")



class RunLogError(ValueError):
    """A run directory is missing a file or holds a record that cannot be read."""


class RunLogWarning(UserWarning):
    """Something in a run directory was skipped (a truncated last line)."""


@dataclass
class RunLog:
    """Everything read from one run directory.

    ``workers`` maps rank → its round records in file order; ``evals`` is sorted by
    ``train_time``; ``ps`` is the parameter server's cumulative byte records (empty when none
    ran); ``service`` is ``service.json`` or ``None``.
    """

    run_dir: Path
    run: dict[str, Any]
    workers: dict[int, list[dict[str, Any]]]
    evals: list[dict[str, Any]] = field(default_factory=list)
    ps: list[dict[str, Any]] = field(default_factory=list)
    service: dict[str, Any] | None = None

    @property
    def config(self) -> dict[str, Any]:
        return self.run.get("config") or {}

    @property
    def mode(self) -> str | None:
        return self.run.get("mode", self.config.get("mode"))

    def rank_info(self, rank: int) -> dict[str, Any]:
        """``run.json``'s entry for ``rank`` (host, device, slowdown), filled in from the
        worker records where run.json lacks it."""
        info: dict[str, Any] = {}
        for entry in self.run.get("ranks") or []:
            if int(entry.get("rank", -1)) == rank:
                info = dict(entry)
                break
        records = self.workers.get(rank) or []
        info.setdefault("rank", rank)
        if info.get("device") is None:
            info["device"] = records[0].get("device", "unknown") if records else "unknown"
        if info.get("host") is None:
            info["host"] = "localhost"
        if info.get("slowdown") is None:
            slowdowns = self.config.get("slowdowns") or []
            info["slowdown"] = float(slowdowns[rank]) if rank < len(slowdowns) else 1.0
        return info


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Read one JSON object per line from ``path``.

    Blank lines are ignored. An unparsable *last* line (a write cut short by a crash) is
    skipped with a :class:`RunLogWarning`; an unparsable line anywhere else, a line that is
    not a JSON object, or a record lacking one of ``required`` raises :class:`RunLogError`
    naming the file and line number.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RunLogError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lineno = i + 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                warnings.warn(
                    f"{path}:{lineno}: skipping unparsable last line (truncated write?)",
                    RunLogWarning,
                    stacklevel=2,
                )
                continue
            raise RunLogError(
                f"{path}:{lineno}: corrupt record ({exc.msg} at column {exc.colno}); only a "
                "truncated last line is tolerated"
            ) from exc
        if not isinstance(record, dict):
            raise RunLogError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        missing = [k for k in required if record.get(k) is None]
        if missing:
            raise RunLogError(f"{path}:{lineno}: record lacks field(s) {', '.join(missing)}")
        records.append(record)
    return records


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunLogError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except OSError as exc:
        raise RunLogError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if not isinstance(data, dict):
        raise RunLogError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_run(run_dir: str | Path) -> RunLog:
    """Read a run directory into a :class:`RunLog`.

    Raises :class:`RunLogError` when the directory does not exist, has no ``run.json``, has no
    ``worker-{rank}.jsonl``, or holds a corrupt record (see :func:`read_jsonl`).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunLogError(f"run directory {run_dir} does not exist (or is not a directory)")
    run_json = RunDir(run_dir).run
    if not run_json.is_file():
        raise RunLogError(f"run directory {run_dir} has no run.json: is this a hetsync run directory?")
    run = _read_json(run_json)

    worker_files = sorted(
        (int(m.group(1)), p)
        for p in run_dir.iterdir()
        if (m := WORKER_FILE.match(p.name)) and p.is_file()
    )
    if not worker_files:
        raise RunLogError(
            f"run directory {run_dir} has no worker-{{rank}}.jsonl files: no worker recorded a round"
        )
    workers = {rank: read_jsonl(path, WORKER_FIELDS) for rank, path in worker_files}

    evals: list[dict[str, Any]] = []
    if RunDir(run_dir).eval.is_file():
        evals = read_jsonl(RunDir(run_dir).eval, EVAL_FIELDS)
        evals.sort(key=lambda e: float(e["train_time"]))  # stable: file order on ties

    ps: list[dict[str, Any]] = []
    if RunDir(run_dir).ps.is_file():
        ps = read_jsonl(RunDir(run_dir).ps, ("bytes_sent",))

    service = None
    for name in (SERVICE, OLD_SERVICE):
        if service is None and (run_dir / name).is_file():
            service = _read_json(run_dir / name)

    return RunLog(run_dir=run_dir, run=run, workers=workers, evals=evals, ps=ps, service=service)
