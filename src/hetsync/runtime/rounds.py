"""The mode's side of a step, a round's accounting and its record, for the training loop and
`hetsync.wrap` alike.

A step, after the caller's forward and backward (`RoundAccount.add_step`):

1. `decide`: the mode takes in what arrived in the background (`Mode.poll`), then decides
   what the step does (`Mode.decide`, no I/O);
2. (the training loop: at a round's end, its agreement — sent before the mode's communication,
   or handed to the mode to ride on its sum: `ControlPath`);
3. `perform`: the local update and the mode's communication, the round counted if the
   action ended one (`Mode.perform`); the part not spent waiting or communicating is the
   round's compute;
4. at a round's end, its record (`RoundAccount.record`) and a new account.

A round's time splits into compute (data, forward, backward, the emulated slowdown and the
local update: what is not spent waiting or communicating), wait, communication and query (the
mode's phase clock), and evaluation (kept apart: training time excludes it); its bytes are the
byte meter's difference over the round. docs/design.md defines every field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hetsync.algorithms.base import Action, Mode, Step


def meter_totals() -> tuple[int, int]:
    from hetsync.comm import meter

    return meter.totals()


@dataclass
class RoundAccount:
    """What the current round has done so far (a new one per round)."""

    eval_total: float = 0.0   # the run's evaluation seconds when the round began
    start: float = field(default_factory=time.perf_counter)  # on the worker's clock
    meter: tuple[int, int] = field(default_factory=meter_totals)
    compute: float = 0.0
    loss_sum: float = 0.0
    steps: int = 0
    samples: int = 0
    #: the data ledger: [epoch, first batch, end batch) ranges of the worker's shard that
    #: this round drew (`draw`); a record's `drawn` (docs/design.md, "The data ledger")
    drawn: list[list[int]] = field(default_factory=list)
    #: the same of the shards it draws for others (`runtime/shards.py`), by shard
    held: dict[int, list[list[int]]] = field(default_factory=dict)

    def add_step(self, compute_s: float, loss: float, samples: int = 0) -> None:
        """A step's forward, backward and emulated slowdown (`compute_s`: less what the
        mode waited or communicated inside them, as DDP does in backward), its loss and its
        batch's samples."""
        self.compute += compute_s
        self.steps += 1
        self.samples += samples
        self.loss_sum += loss

    def draw(self, epoch: int, batch: int, shard: int | None = None) -> None:
        """Batch `batch` (0-based) of epoch `epoch` of the worker's shard (or of `shard`,
        another's it holds) was drawn."""
        drawn = self.drawn if shard is None else self.held.setdefault(shard, [])
        last = drawn[-1] if drawn else None
        if last is not None and last[0] == epoch and last[2] == batch:
            last[2] += 1
        else:
            drawn.append([epoch, batch, batch + 1])

    def record(self, mode, rank: int, round_: int, t0: float, eval_total: float,
               epoch: int) -> dict[str, Any]:
        """The round's record (`worker-R.jsonl`); takes the mode's phase clock."""
        spent = mode.comm.clock.take()
        sent, recv = meter_totals()
        return {
            "rank": rank, "device": mode.comm.device_name, "round": round_,
            "local_steps": self.steps, "samples": self.samples,
            "t_start": self.start - t0, "t_end": mode.comm.clock.now() - t0,
            "compute_s": self.compute,
            "wait_s": spent.get("wait", 0.0) + spent.get("query", 0.0),
            "comm_s": spent.get("comm", 0.0), "query_s": spent.get("query", 0.0),
            "eval_s": eval_total - self.eval_total, "bytes_sent": sent - self.meter[0],
            "bytes_recv": recv - self.meter[1],
            "loss": self.loss_sum / self.steps if self.steps else float("nan"),
            "lr": mode.lr, "epoch": epoch, **({"drawn": self.drawn} if self.drawn else {}),
            **mode.round_record()}


def decide(mode: Mode, step: Step) -> Action:
    """Step 1 (see the module docstring): take in what arrived, then decide."""
    mode.poll()
    return mode.decide(step)


def perform(mode: Mode, action: Action, rnd: RoundAccount) -> int:
    """Step 3: apply `action` and count the round it ends; its local part is `rnd`'s
    compute. Returns the round it finished (or is part of)."""
    finished, clock = mode.round, mode.comm.clock
    applying, waited = clock.now(), clock.total()
    mode.perform(action)
    rnd.compute += (clock.now() - applying) - (clock.total() - waited)
    return finished
