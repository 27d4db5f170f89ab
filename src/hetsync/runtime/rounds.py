"""A round's accounting and its record, for the training loop and `hetsync.wrap` alike.

A round's time splits into compute (data, forward, backward, the emulated slowdown and the
local update: what is not spent waiting or communicating), wait, communication and query (the
mode's phase clock), and evaluation (kept apart: training time excludes it); its bytes are the
byte meter's difference over the round. docs/design.md defines every field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def meter_totals() -> tuple[int, int]:
    from hetsync.comm import meter

    return meter.totals()


@dataclass
class RoundAccount:
    """What the current round has done so far (a new one per round)."""

    eval_total: float = 0.0   # the run's evaluation seconds when the round began
    start: float = field(default_factory=time.perf_counter)
    meter: tuple[int, int] = field(default_factory=meter_totals)
    compute: float = 0.0
    loss_sum: float = 0.0
    steps: int = 0
    samples: int = 0
    #: the data ledger: [epoch, first batch, end batch) ranges of the worker's shard that
    #: this round drew (`draw`); a record's `drawn` (docs/design.md, "The data ledger")
    drawn: list[list[int]] = field(default_factory=list)

    def draw(self, epoch: int, batch: int) -> None:
        """Batch `batch` (0-based) of the shard's epoch `epoch` was drawn."""
        last = self.drawn[-1] if self.drawn else None
        if last is not None and last[0] == epoch and last[2] == batch:
            last[2] += 1
        else:
            self.drawn.append([epoch, batch, batch + 1])

    def record(self, mode, rank: int, round_: int, t0: float, eval_total: float,
               epoch: int) -> dict[str, Any]:
        """The round's record (`worker-R.jsonl`); takes the mode's phase clock."""
        spent = mode.comm.clock.take()
        sent, recv = meter_totals()
        return {
            "rank": rank, "device": mode.comm.device_name, "round": round_,
            "local_steps": self.steps, "samples": self.samples,
            "t_start": self.start - t0, "t_end": time.perf_counter() - t0,
            "compute_s": self.compute,
            "wait_s": spent.get("wait", 0.0) + spent.get("query", 0.0),
            "comm_s": spent.get("comm", 0.0), "query_s": spent.get("query", 0.0),
            "eval_s": eval_total - self.eval_total, "bytes_sent": sent - self.meter[0],
            "bytes_recv": recv - self.meter[1],
            "loss": self.loss_sum / self.steps if self.steps else float("nan"),
            "lr": mode.lr, "epoch": epoch, **({"drawn": self.drawn} if self.drawn else {}),
            **mode.round_record()}
