"""Evaluation of the global model, off the workers' critical path.

`evaluate` is a model's accuracy and mean loss on the whole test set. Deferred evaluation
(`--deferred-eval 1`, the default) never pauses training for it:

1. at an evaluation point the leader (rank 0) copies the global model to the CPU, stamped with the training
   time, round and samples seen, and hands it to a writer thread (`SnapshotWriter`), which saves
   it atomically as `RUN_DIR/snapshots/NNNNNN.pt`; training goes on at once;
2. an evaluator evaluates the snapshots on disk (`evaluate_pending`), appends each result to
   `eval.jsonl` and removes the snapshot. Under `launch` and `bench` (`--evaluator 1`) it is a
   process of its own at the lowest CPU priority, on the cores the slower devices share
   (`follow`, `hetsync evaluate RUN_DIR --follow`): while the run goes on it evaluates the
   newest snapshot and rests, so that it computes at most `DUTY` of the time (the run's end,
   in run.json, cuts a rest short), and after the run the ones it skipped, in order. The
   accuracy is known while the run goes on and no worker pauses; the readers sort the
   records by training time. On a virtual clock it evaluates every pending one, in order,
   before it rests: there the newest first would leave `eval.jsonl`'s lines in an order
   that follows the machine's load, where the rest of such a run's records are the same
   bytes on any machine. (Its priority alone did not keep it off the devices: on this
   machine's kernel, PREEMPT_NONE with 250 Hz ticks, a device that woke beside it waited for
   the next tick, and the slowdown-5 device of a 1, 2, 4, 8 cluster ran at 90 % of its
   nominal speed with an evaluator busy 35 % of the time, at 96 % without.) Without an
   evaluator, the leader evaluates them in order after training;
3. the emptied `snapshots/` goes only after the run (`remove_if_empty`): an evaluator that
   removed it while the run went on raced the writer, which had just made it, and the
   leader's next snapshot failed ("No such file or directory": once in CI);
4. the snapshots taken before a checkpoint are on disk before it (`SnapshotWriter.flush`), so
   a crash loses none; a resumed run drops those taken after its checkpoint (lost work).

Each evaluation record holds the snapshot's stamp (`t, train_time, round, samples_seen`), the
result (`test_acc, test_loss`: for text the next character's accuracy and the loss in nats
per character) and `lag_s`, the real seconds from the snapshot to its evaluation (not on a
virtual clock: a run's records there are the same on any machine).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from hetsync.runtime.checkpoint import VERSION, load, save_atomic
from hetsync.telemetry.rundir import RunDir

SNAPSHOTS = "snapshots"


@dataclass
class Evaluation:
    test_acc: float
    test_loss: float


def evaluate(model: torch.nn.Module, dataset, device: torch.device,
             batch_size: int = 1000) -> Evaluation:
    """Accuracy and mean loss per prediction on the whole test set (exact counts, not a mean
    of batch means): per image, or for text per character (a window of T characters is T
    predictions, its logits class-second)."""
    was_training = model.training
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, len(dataset), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(dataset)))
            x, y = dataset.batch(idx)
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            n += y.numel()
    model.train(was_training)
    return Evaluation(correct / n, loss_sum / n)


# ---------------------------------------------------------------------- snapshots on disk
def snapshot_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SNAPSHOTS


def pending(run_dir: str | Path) -> list[Path]:
    """The snapshots awaiting evaluation, oldest first."""
    root = snapshot_dir(run_dir)
    return sorted(root.glob("[0-9]*.pt")) if root.is_dir() else []


def load_snapshot(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(stamp, model state) of a snapshot file; CheckpointError if it cannot be read."""
    state = load(path)
    return state["stamp"], state["model"]


def drop_after(run_dir: str | Path, train_time: float) -> None:
    """A resumed run: the snapshots taken after its checkpoint belong to lost work."""
    for path in pending(run_dir):
        if load_snapshot(path)[0]["train_time"] > train_time + 1e-6:
            path.unlink()


class SnapshotWriter:
    """The leader's snapshots of the global model, written to disk by a thread of their own
    (a save never holds up a step), numbered after those already there and after `after`;
    `stamp_taken`: each stamped with the real time it was taken (for `lag_s`)."""

    def __init__(self, run_dir: str | Path, after: int = 0, stamp_taken: bool = True):
        self.root = snapshot_dir(run_dir)
        self.stamp_taken = stamp_taken
        existing = pending(run_dir)
        self.number = max(after, int(existing[-1].stem) if existing else 0)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, daemon=True,
                                        name="hetsync-snapshots")
        self._thread.start()

    def put(self, stamp: dict[str, Any], state: dict[str, torch.Tensor],
            first: bool = False) -> None:
        """Queue a snapshot (`state`: a CPU copy, which the caller no longer touches);
        `first`: the starting model's, numbered 0, before every other."""
        self._raise()
        if not first:
            self.number += 1
        path = self.root / f"{0 if first else self.number:06d}.pt"
        taken = {"taken_at": time.time()} if self.stamp_taken else {}
        self._queue.put((path, {"version": VERSION, "stamp": {**stamp, **taken},
                                "model": state}))

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    save_atomic(*item)
            except BaseException as err:  # (reported by the next put or flush)
                self._error = err
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every snapshot queued is on disk."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"a snapshot could not be written to {self.root}: "
                               f"{self._error}") from self._error


def evaluate_pending(run_dir: str | Path, model: torch.nn.Module, test_set,
                     device: torch.device, record: Callable[[dict], None],
                     newest: bool = False) -> int:
    """Evaluate the snapshots on disk in order (`newest`: only the newest), `record` each
    result and remove the snapshot; how many were evaluated."""
    done = 0
    for path in pending(run_dir)[-1:] if newest else pending(run_dir):
        stamp, state = load_snapshot(path)
        model.load_state_dict(state)
        result = evaluate(model, test_set, device)
        taken = stamp.pop("taken_at", None)  # (none on a virtual clock: a real lag there
        # would make a run's records differ from its twin's)
        record({**stamp, "test_acc": result.test_acc, "test_loss": result.test_loss,
                **({} if taken is None else {"lag_s": max(0.0, time.time() - taken)})})
        path.unlink()
        done += 1
    return done


def remove_if_empty(run_dir: str | Path) -> None:
    """Remove the snapshot directory once every snapshot is evaluated. Only after the run:
    while it goes on, the leader's writer may be about to create a file in it."""
    try:
        snapshot_dir(run_dir).rmdir()
    except OSError:  # (not there, or not empty)
        pass


def wait_evaluated(run_dir: str | Path, timeout: float, poll_s: float = 0.2) -> bool:
    """Wait up to `timeout` s for the evaluator to evaluate every snapshot; whether it did."""
    deadline = time.monotonic() + timeout
    while pending(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


# ---------------------------------------------------------------------- the evaluator process
def lower_priority() -> str:
    """Run this process only on CPU time nobody else wants: Linux's SCHED_IDLE, else nice 19.
    Call it before any thread starts (threads inherit it). What it got, for the log."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        try:
            os.nice(19)
            return "nice 19"
        except OSError:
            return "normal priority (neither SCHED_IDLE nor nice was allowed)"


def _ended(run_dir: Path) -> bool:
    """Whether the run's workers have finished: its run.json has an end time (rank 0 writes
    run.json without one when an attempt starts, a resumed one too, and with one when it
    ends; launch's evaluator first waits for this attempt's run.json: `follow`'s
    `start_after`).
    Not "ended since the evaluator started": a short run may end while it imports torch."""
    import json

    try:
        run = json.loads(RunDir(run_dir).run.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(run.get("end_time"), (int, float))


#: the longest the evaluator waits for rank 0 to start (as the workers' rendezvous waits)
START_WAIT_S = 120.0


def _started(run_dir: Path, after: float, wait_s: float, poll_s: float = 0.2) -> bool:
    """Wait until `run_dir`'s run.json was written after `after` (seconds since the epoch),
    at most `wait_s`; whether it was."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if RunDir(run_dir).run.stat().st_mtime >= after:
                return True
        except FileNotFoundError:
            pass
        time.sleep(poll_s)
    return False


def _silent_for(run_dir: Path, since: float) -> float:
    """Seconds since a worker last recorded a round (or since `since`, if later): a run
    whose workers all died without ending stays silent."""
    times = [since] + [p.stat().st_mtime for p in RunDir(run_dir).worker_files()]
    return time.time() - max(times)


#: the most of its time the evaluator computes while the run goes on
DUTY = 0.1


def follow(run_dir: str | Path, *, until_end: bool = True, poll_s: float = 0.05,
           duty: float = DUTY, start_after: float | None = None) -> int:
    """The evaluator: evaluate `run_dir`'s snapshots into its `eval.jsonl` (see the module
    docstring) — with `until_end`, the newest as they are written (on a virtual clock, every
    one, in order), computing at most `duty` of the time, until the run has ended; then every
    one left, in order. How many it evaluated. It stops following a run whose workers have been
    silent for its `--timeout` (they died without ending it), saying so on stderr. `start_after`
    (launch's, which starts it with the workers): first wait until rank 0 has written run.json
    after that time, once the model and data are ready (a resumed run's rank 0 cuts eval.jsonl
    back first), at most `--timeout` or the start's rendezvous bound (`worker.RENDEZVOUS_S`)."""
    from hetsync.config import Config
    from hetsync.telemetry.recorder import JsonlWriter

    run_dir = Path(run_dir)
    cfg = Config.load(RunDir(run_dir).config)
    torch.set_num_threads(1)
    data = cfg.load_data()
    model = cfg.build_model(data)
    device = torch.device("cpu")
    if until_end and start_after is not None and not _started(run_dir, start_after,
                                                              max(cfg.timeout, START_WAIT_S)):
        print(f"hetsync evaluate: {run_dir}'s rank 0 did not start within "
              f"{max(cfg.timeout, START_WAIT_S):g} s: evaluating what is there",
              file=sys.stderr, flush=True)
        until_end = False
    started = time.time()
    total = 0
    rest_until = 0.0  # (monotonic) the duty's rest after an evaluation: the end cuts it short
    with JsonlWriter(RunDir(run_dir).eval) as out:
        while until_end and not _ended(run_dir):
            if _silent_for(run_dir, started) > cfg.timeout:
                print(f"hetsync evaluate: no worker of {run_dir} has recorded a round for "
                      f"{cfg.timeout:g} s (--timeout); the run is taken as dead: evaluating "
                      f"what is left", file=sys.stderr, flush=True)
                break
            if time.monotonic() >= rest_until:
                began = time.process_time()  # (its wall time grows with the devices' load)
                done = evaluate_pending(run_dir, model, data.test, device, out.write,
                                        newest=cfg.clock != "virtual")
                total += done
                busy = time.process_time() - began
                rest_until = time.monotonic() + (busy * (1 / duty - 1) if done else 0.0)
            time.sleep(poll_s)
        if until_end:  # the devices are done: every core is the evaluator's
            _spread_out()
        total += evaluate_pending(run_dir, model, data.test, device, out.write)
    if _ended(run_dir):
        remove_if_empty(run_dir)
    return total


def _spread_out() -> None:
    """Run on every CPU this process may use, on as many threads."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError):  # (a CPU outside the cpuset: stay)
        pass
    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else 1)
