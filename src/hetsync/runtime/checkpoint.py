"""Checkpoints of a run, and resuming from them.

What a checkpoint holds (one file per worker, `RUN_DIR/checkpoints/NNNNNN/rank-R.pt`):

1. the leader's file (rank 0's, or once it was lost the lowest survivor's, which keeps the
   lead): the **global model** (what evaluation sees, the parameter server's weights in the
   asynchronous modes), taken after what was in flight is settled;
2. every worker's file: its optimizer's state, its mode's `state_dict` (round counter, outer
   optimizer, sparse memories, ...), its data position (epoch, batch), the last round it
   recorded, and the loop's clock and counters (elapsed and training time, samples seen by
   all, evaluations; the leader's are the ones that matter: it decides when to stop).

When: at every `--checkpoint-every`-th agreed evaluation and at the agreed stop, after the
round's record, so every worker of a collective mode writes at the same round (a worker of
an asynchronous mode, which takes part in no evaluation, every as many `--eval-interval`s of
its own training time). Writing is not training: its time counts as evaluation. Each file is
written to a temporary name, fsynced and renamed (then the directory fsynced): a crash leaves
the previous checkpoint whole. The last `KEEP` checkpoints are kept.

Resuming (`launch --resume RUN_DIR`, `worker --resume`): each rank lists the checkpoints whose
file of its own loads (`torch.load(weights_only=True)`; a corrupt or truncated one is reported
and skipped); a collective mode takes the newest that every worker can load, an asynchronous
one each worker's newest. Every worker — and the parameter server — starts from the leader's
global model of that checkpoint (the leader reads it and broadcasts it: across machines only its
host has the file), then loads its own optimizer, mode state and data position; every rank
takes the leader's clock, and the count of samples goes on from the leader's.
The run's logs are cut back to the checkpoint (records after it are dropped) and appended to,
so the curves continue.

Resuming after a loss: a run that went on without a worker (`runtime/membership.py`) writes the
ranks it lost into every worker's file (`lost`), so its later checkpoints are complete without
theirs. A collective mode resumes from the newest checkpoint that every worker it had not lost
by then can load; a rank lost before it (rank 0 too; eager-SGD's too) is restarted in it
(`for_restarted_rank`): the round, loop counters and what the mode's workers hold in common
(`Mode.restart_state`: the global weights and the outer optimizer, not the peer's own step
times or control variates) of the checkpoint's leader (the rank whose file holds its global
model, `leader`), a fresh local optimizer, and the data position where its records written
before the checkpoint end
(their work is in the global model; those records are kept, any later ones dropped). In an
asynchronous mode, whose workers count their own rounds, it counts on from its own last kept
record, not from the leader's count. The restarted rank reads the leader's file, so the run
directory must be one that every worker sees (as under `launch`).

An aggregation in flight (ESync's background sum) is completed first (`Mode.settle`), so
it is in the checkpoint. The snapshots of the global model that deferred evaluation takes
before a checkpoint are on disk before it (`runtime/evaluation.py`), so a crash loses none;
those taken after it are dropped on resuming. Where hetsync
departs from a bit-exact restart: every worker restarts from the global model, not from its
own local model; a parameter server's rule restarts from the global weights (DC-ASGD's backups
and DGS's per-worker snapshots are rebuilt as at a start); SelSync's injected samples are
drawn afresh.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from hetsync.telemetry import ledger
from hetsync.telemetry.rundir import CHECKPOINTS

# 3: the loop keeps its last loss (--target-loss); 2: a local-step mode's outer optimizer is
# a torch.optim.SGD, its round length apart
VERSION = 3
KEEP = 2
DIR = CHECKPOINTS


class CheckpointError(RuntimeError):
    """No usable checkpoint (one line saying where and why)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temporary file beside `path`, fsync, rename over `path`."""
    for attempt in range(3):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            break
        # another process removed the emptied directory as it was made (mkdir's "exists",
        # then not a directory) or before the file was (the last rank out of an old
        # checkpoint, `Checkpointer.write`); once the file is in, none can
        except (FileNotFoundError, FileExistsError):
            if attempt == 2:
                raise
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path: Path) -> dict[str, Any]:
    """A checkpoint file's contents (tensors on the CPU); CheckpointError if it cannot be."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt, or not a checkpoint at all
        raise CheckpointError(f"{path}: cannot be loaded ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a hetsync checkpoint of version {VERSION}")
    return state


def file_of(run_dir: Path, index: int, rank: int) -> Path:
    return Path(run_dir) / DIR / f"{index:06d}" / f"rank-{rank}.pt"


def indices(run_dir: Path) -> list[int]:
    """The checkpoint indices present in `run_dir`, newest first."""
    root = Path(run_dir) / DIR
    if not root.is_dir():
        return []
    return sorted((int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()),
                  reverse=True)


def newest(run_dir: Path, rank: int) -> int:
    """The highest index of `rank`'s files in `run_dir` (0: none)."""
    return max((i for i in indices(run_dir) if file_of(run_dir, i, rank).exists()), default=0)


def survey(run_dir: Path, rank: int, stream=None) -> dict[int, dict[str, Any]]:
    """The checkpoints whose file of `rank` loads, newest first, each with the ranks the run
    had lost when it was written (``lost``), whether it holds the global model (``global``:
    `rank` led) and when, in the run's seconds (``t``); each file that does not load is
    reported."""
    ok = {}
    for index in indices(run_dir):
        path = file_of(run_dir, index, rank)
        if not path.exists():
            continue
        try:
            state = load(path)
            ok[index] = {"lost": [int(r) for r in state.get("lost", [])],
                         "global": "global" in state,
                         "t": float(state.get("loop", {}).get("t", 0.0))}
        except CheckpointError as err:
            print(f"rank {rank}: skipping checkpoint {index}: {err}",
                  file=stream or sys.stderr, flush=True)
    return ok


def loadable(run_dir: Path, rank: int, stream=None) -> list[int]:
    """The indices whose file of `rank` loads, newest first; each that does not is reported."""
    return list(survey(run_dir, rank, stream))


def leader(index: int, holders: dict[int, dict[int, float]]) -> int | None:
    """The rank that led when checkpoint `index` was written: the one whose file of it holds
    the global model (`holders_at`) — of several, the newest (asynchronous ranks number
    their files apart: a rank lost since may hold an older file of that number). The lead is
    not recomputed from the ranks lost: a rank 0 that joined again after another took the
    lead does not lead (`runtime/membership.py`). None: no file of it holds the global
    model."""
    held = holders.get(index, {})
    return max(sorted(held), key=held.__getitem__) if held else None


def reference(per_rank: list[list[int]], collective: bool, lost: dict[int, set[int]],
              holders: dict[int, dict[int, float]]) -> int | None:
    """The checkpoint whose global model every process resumes from: in a collective mode,
    the newest that has a `leader` and that every worker not lost when it was written
    (`lost`: index -> ranks) can load; in an asynchronous one, whose ranks number their
    files apart, the one whose leader's file was written last. None: there is none."""
    held = [i for i in sorted(set().union(*map(set, per_rank)), reverse=True)
            if holders.get(i)]
    if not collective:  # (its leader's file is the newest of its number: `leader`)
        return max(held, key=lambda i: max(holders[i].values()), default=None)
    for index in held:
        gone = lost.get(index, set())
        if all(index in mine or r in gone for r, mine in enumerate(per_rank)):
            return index
    return None


def choose(per_rank: list[list[int]], rank: int, collective: bool, lost: dict[int, set[int]],
           holders: dict[int, dict[int, float]]) -> int | None:
    """The checkpoint `rank` resumes from: the `reference` in a collective mode (the workers
    must agree on the round), for a rank lost before it and for one that has written none
    yet (a spare that joined since: restarted from it), else its own newest. None: there is
    none."""
    ref = reference(per_rank, collective, lost, holders)
    if ref is None or collective or rank in lost.get(ref, ()) or not per_rank[rank]:
        return ref
    return per_rank[rank][0]


def lost_at(surveys: list[dict[int, dict]]) -> dict[int, set[int]]:
    """Index -> the ranks lost when it was written, from every worker's `survey`."""
    lost: dict[int, set[int]] = {}
    for mine in surveys:
        for index, entry in mine.items():
            lost.setdefault(int(index), set()).update(entry["lost"])
    return lost


def holders_at(surveys: list[dict[int, dict]]) -> dict[int, dict[int, float]]:
    """Index -> {rank: when it was written} of the files of it that hold the global model
    (its leader's, where its `reference` may start from), from every worker's `survey`."""
    holders: dict[int, dict[int, float]] = {}
    for rank, mine in enumerate(surveys):
        for index, entry in mine.items():
            if entry["global"]:
                holders.setdefault(int(index), {})[rank] = float(entry.get("t", 0.0))
    return holders


def resumable(run_dir: Path, workers: int, collective: bool) -> bool:
    """Whether `--resume run_dir` finds a checkpoint for every one of `workers` (as `choose`
    would pick them), so that suggesting it is not suggesting what would fail."""
    quiet = io.StringIO()  # (the resume itself reports what it skips)
    surveys = [survey(run_dir, r, stream=quiet) for r in range(workers)]
    per_rank, lost, holders = [list(s) for s in surveys], lost_at(surveys), holders_at(surveys)
    return all(choose(per_rank, r, collective, lost, holders) is not None
               for r in range(workers))


def for_restarted_rank(run_dir: Path, index: int, rank: int, leader: int,
                       own_newest: int | None, records: list[dict[str, Any]] = (),
                       own_rounds: bool = False, held: list[dict[str, Any]] = ()) -> dict:
    """The checkpoint of a `rank` that checkpoint `index` was written without (it was lost):
    its `leader`'s file of `index` (round, loop counters, mode state) with no optimizer
    state. Of the rank's round `records`, those that ended before the checkpoint are kept
    (`records_until`): their work went into the global model it restarts from (a later one
    is an attempt since, e.g. a resume that failed, and is dropped). Its data position is
    where the draws of its shard end in the kept records and in the other workers' records
    that the resume keeps (`held`: those of the members that drew its shard meanwhile,
    `runtime/shards.py`), else that of its own newest checkpoint `own_newest`, else its
    start. The mode's `restart_state` keeps of the leader's state only what the workers
    share. `own_rounds`: each worker counts its own rounds (an asynchronous mode): the rank
    counts on after its last kept record instead of taking the leader's count."""
    peer = load(file_of(run_dir, index, leader))
    until = float(peer["loop"]["t"])
    kept = [r for r in records if r.get("t_end", math.inf) <= until]
    reached = ledger.reached([{**r, "rank": rank} for r in kept] + list(held), shard=rank)
    data = (reached if reached is not None else
            load(file_of(run_dir, own_newest, rank))["data"] if own_newest is not None
            else {"epoch": 0, "batch": 0})
    peer.pop("global", None)
    if own_rounds and kept:
        last = max(int(r["round"]) for r in kept)
        peer.update(round=last + 1, recorded_round=last,
                    mode={**peer["mode"], "round": last + 1})
    return {**peer, "rank": rank, "optimizer": None, "data": data, "restarted": True,
            "records_until": until}


def drawn_on_since(own: dict, records: list[dict[str, Any]] = (),
                   held: list[dict[str, Any]] = ()) -> dict:
    """An asynchronous rank's checkpoint `own` where the other workers' records the resume
    keeps (`held`) drew its shard past `own`'s data position: it was lost after `own` was
    written, and a member drew its shard on meanwhile (`runtime/shards.py`, step 6). Then it
    draws on from where its own round `records` (in the order written, their rounds rising)
    and those draws reach without a gap from `own`'s position, keeps its records up to
    there and counts its rounds on after the last one kept; else `own` as it is. (A gap: it
    joined again and drew on from where the member had got to, but the member's draws after
    its own checkpoint are cut by the resume — they are drawn again, and this rank's own
    since then with them.)"""
    rank, data = int(own["rank"]), own["data"]
    others = ledger.reached(held, shard=rank)
    if others is None or (others["epoch"], others["batch"]) <= (data["epoch"], data["batch"]):
        return own
    ranges, batches = ledger.shard_ranges([{**r, "rank": rank} for r in records] + list(held),
                                          rank)
    reach = ledger.covered((data["epoch"], data["batch"]), ranges, batches)
    kept = []  # (its records in order, up to the first that drew past a gap)
    for r in records:
        if any(ledger.position(int(e), int(end), batches) > reach
               for e, _, end in r.get("drawn") or ()):
            break
        kept.append(r)
    last = max([int(r["round"]) for r in kept] + [int(own["recorded_round"])])
    return {**own, "data": {"epoch": reach[0], "batch": reach[1]},
            "round": last + 1, "recorded_round": last,  # (its records are cut after it)
            "mode": {**own["mode"], "round": last + 1}, "restarted": True}


class Checkpointer:
    """Writes this rank's checkpoints into `run_dir`, numbering them 1, 2, ... (continuing
    after `start` on a resumed run) and keeping the last `keep`."""

    def __init__(self, run_dir: Path, rank: int, start: int = 0, keep: int = KEEP):
        self.run_dir, self.rank, self.index, self.keep = Path(run_dir), rank, start, keep

    def write(self, state: dict[str, Any]) -> Path:
        self.index += 1
        path = file_of(self.run_dir, self.index, self.rank)
        save_atomic(path, {"version": VERSION, "index": self.index, "rank": self.rank, **state})
        mine = [i for i in indices(self.run_dir) if file_of(self.run_dir, i, self.rank).exists()]
        for old in mine[self.keep:]:  # (ranks of an asynchronous mode number apart)
            stale = file_of(self.run_dir, old, self.rank)
            stale.unlink()
            try:
                stale.parent.rmdir()  # the last rank out removes the directory
            except OSError:
                pass
        return path


def cut_jsonl(path: Path, keep) -> int:
    """Rewrite the JSON-lines file `path` (atomically) with only the records `keep(record)`
    accepts, dropping any partial line; how many were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if keep(record):
            kept.append(line)
        else:
            dropped += 1
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped
