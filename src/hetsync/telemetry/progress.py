"""Progress display for a running cluster, read from the run directory as the workers write it.

On a terminal one line is redrawn in place; otherwise (CI, a log file) a line is printed every
few seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hetsync.telemetry.metric import metric_of
from hetsync.telemetry.rundir import RunDir


class JsonlTail:
    """Reads the complete lines appended to a JSONL file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self._partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for its end
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out


class ClusterProgress:
    def __init__(self, run_dir: Path, cfg, stream=sys.stdout, enabled: bool = True,
                 every_s: float = 5.0):
        self.cfg, self.stream, self.enabled = cfg, stream, enabled
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.every_s, self.last_print = every_s, 0.0
        self.eval_tail = JsonlTail(RunDir(run_dir).eval)
        self.worker_tails = {r: JsonlTail(RunDir(run_dir).worker(r))
                             for r in range(cfg.workers)}
        self.last_eval: dict | None = None
        self.samples = 0
        self.rounds = {r: 0 for r in range(cfg.workers)}
        self.steps_last = {r: 0 for r in range(cfg.workers)}
        self.t_end = 0.0
        self.started = time.monotonic()
        self._drawn = False

    def _line(self) -> str:
        mode = self.cfg.effective_mode
        elapsed = time.monotonic() - self.started
        acc = metric_of(self.cfg.dataset).show(self.last_eval) + (
            "" if self.last_eval is None else f" @ {self.last_eval['train_time']:.0f}s")
        rate = self.samples / self.t_end if self.t_end > 0 else 0.0
        rnd = max(self.rounds.values(), default=0)
        steps = " ".join(f"w{r}:{s}" for r, s in self.steps_last.items())
        budget = f"/{self.cfg.time_budget:.0f}" if self.cfg.time_budget else ""
        # on a virtual clock, how far its time is, and the real time the simulation has taken
        when = (f"{self.t_end:5.1f}{budget}s virtual, {elapsed:.0f}s real"
                if self.cfg.clock == "virtual" else f"{elapsed:5.0f}{budget}s")
        return (f"[{mode}] {when} | round {rnd:6d} | {acc} | "
                f"{rate:7.0f} samples/s | steps/round {steps}")

    def update(self, final: bool = False) -> None:
        for rec in self.eval_tail.read():  # the newest model's (an evaluator may go back)
            if self.last_eval is None or rec.get("train_time", 0) >= self.last_eval.get(
                    "train_time", 0):
                self.last_eval = rec
        for r, tail in self.worker_tails.items():
            for rec in tail.read():
                self.samples += rec.get("samples", 0)
                self.rounds[r] = rec.get("round", self.rounds[r])
                self.steps_last[r] = rec.get("local_steps", 0)
                self.t_end = max(self.t_end, rec.get("t_end", 0.0))
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self._line())
            self.stream.flush()
            self._drawn = True
        elif final or now - self.last_print >= self.every_s:
            print(self._line(), file=self.stream, flush=True)
            self.last_print = now

    def close(self) -> None:
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
