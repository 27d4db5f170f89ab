"""The bench's progress line: which run is going (k of n), how far (on a virtual clock, in
virtual and in real seconds), the last accuracy or loss.

Read from the run directory while the run's processes write it (the same files
:mod:`hetsync.telemetry.progress` reads), from a background thread, so it works the same for
hetsync's `launch` and for the PyTorch baselines. On a terminal the line is redrawn in place;
otherwise one line is printed every few seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from hetsync.telemetry.metric import ACCURACY, Metric
from hetsync.telemetry.progress import JsonlTail
from hetsync.telemetry.rundir import RunDir


class RunProgress:
    """Progress of run `k` of `n` (label, run directory, stopping rule)."""

    def __init__(self, run_dir: Path, label: str, k: int, n: int, workers: int, *,
                 time_budget: float | None = None, epochs: float | None = None,
                 train_size: int | None = None, stream=None, every_s: float = 10.0,
                 enabled: bool = True, metric: Metric = ACCURACY, virtual: bool = False):
        self.metric = metric
        #: the run is timed by a virtual clock: the line shows its real time beside
        self.virtual = virtual
        self.label, self.k, self.n = label, k, n
        self.time_budget, self.epochs, self.train_size = time_budget, epochs, train_size
        self.stream = stream = stream or sys.stdout
        self.enabled, self.every_s = enabled, every_s
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.eval_tail = JsonlTail(RunDir(run_dir).eval)
        self.tails = [JsonlTail(RunDir(run_dir).worker(r)) for r in range(workers)]
        self.started = time.monotonic()
        self.last_eval: dict | None = None
        self.samples, self.t_end, self.last_print = 0, 0.0, 0.0
        self.train_time = 0.0  # rank 0's clock less its evaluation pauses (the budget's clock)
        self._eval_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def line(self) -> str:
        head = f"[{self.k}/{self.n}] {self.label:<9}"
        if self.t_end == 0 and self.last_eval is None:
            return f"{head} starting ({time.monotonic() - self.started:.0f} s)"
        if self.epochs is not None and self.train_size:
            how_far = f"epoch {self.samples / self.train_size:4.2f}/{self.epochs:g}"
        else:
            budget = f"/{self.time_budget:.0f}" if self.time_budget else ""
            how_far = f"train {self.train_time:5.1f}{budget} s"
            if self.virtual:
                how_far += f" virtual, {time.monotonic() - self.started:.0f} s real"
        acc = self.metric.show(self.last_eval) + (
            "" if self.last_eval is None else f" @ {self.last_eval['train_time']:.1f} s")
        rate = self.samples / self.train_time if self.train_time > 0 else 0.0
        return f"{head} {how_far} | {acc} | {rate:7.0f} samples/s"

    def update(self, final: bool = False) -> None:
        with self._lock:
            for rec in self.eval_tail.read():
                self.last_eval = rec
            for rank, tail in enumerate(self.tails):
                for rec in tail.read():
                    self.samples += int(rec.get("samples", 0))
                    self.t_end = max(self.t_end, float(rec.get("t_end", 0.0)))
                    if rank == 0:
                        self._eval_s += float(rec.get("eval_s") or 0.0)
                        self.train_time = float(rec.get("t_end", 0.0)) - self._eval_s
            if not self.enabled:
                return
            now = time.monotonic()
            if self.tty:
                self.stream.write("\r\x1b[2K" + self.line() + ("\n" if final else ""))
                self.stream.flush()
            elif final or now - self.last_print >= self.every_s:
                print(self.line(), file=self.stream, flush=True)
                self.last_print = now

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.update()

    def __enter__(self) -> "RunProgress":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.update(final=exc[0] is None)
        if exc[0] is not None and self.enabled and self.tty:
            self.stream.write("\n")
