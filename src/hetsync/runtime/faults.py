"""Faults injected at a chosen rank and round, for tests: as torchft's tests inject theirs,
instead of a `kill -9` from outside at whatever moment it lands.

`HETSYNC_FAULT=RANK:ROUND:KIND[,...]` in a worker's environment (launch passes its own on):
rank RANK, once its mode's round counter has reached ROUND (between two steps), does KIND --

- ``exit``: ends its process at once (`os._exit`, code :data:`EXIT_CODE`: no `finally`
  runs, no goodbye is said, as a crash);
- ``hang``: stops making progress without closing anything (a wedged process: its peers
  see only silence, which their --timeout or the watchdogs must end);
- ``slow``: its device runs at half its speed from then on (its emulated slowdown doubled,
  as a throttled or shared device: what re-planned batches follow, `runtime/replan.py`).

1. :func:`planned` reads the faults meant for a rank (ConfigError on a malformed value);
2. :func:`due` is the pure predicate: whether one of them is due at a round;
3. :func:`inject` does it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from hetsync.options import ConfigError
from hetsync.telemetry.rundir import RunDir, tell

ENV = "HETSYNC_FAULT"
KINDS = ("exit", "hang", "slow")
#: an injected exit's code (apart from a crash's 1 and a signal's negative codes)
EXIT_CODE = 17


@dataclass(frozen=True)
class Fault:
    rank: int
    round: int
    kind: str


def parse(text: str) -> list[Fault]:
    """The faults `text` (the variable's value) names; ConfigError naming a bad one."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split(":")
        try:
            rank, round_, kind = int(fields[0]), int(fields[1]), fields[2]
            if len(fields) != 3 or rank < 0 or round_ < 0 or kind not in KINDS:
                raise ValueError
        except (ValueError, IndexError):
            raise ConfigError(f"{ENV}={text!r}: {item!r} is not RANK:ROUND:KIND with RANK and "
                              f"ROUND integers >= 0 and KIND one of {', '.join(KINDS)}") \
                from None
        faults.append(Fault(rank, round_, kind))
    return faults


def planned(rank: int, run_dir=None) -> list[Fault]:
    """The faults the environment plans for `rank`, but those `run_dir`'s events say were
    injected already: a fault happens once in a run, not again in a process started after
    it (a resumed run's, which counts its rounds again from a checkpoint before it)."""
    done = {(e.get("rank"), e.get("round"), e.get("kind"))
            for e in (RunDir(run_dir).read_events("fault") if run_dir is not None else ())}
    return [f for f in parse(os.environ.get(ENV, ""))
            if f.rank == rank and (f.rank, f.round, f.kind) not in done]


def due(faults: list[Fault], round_: int) -> Fault | None:
    """The fault to inject now that the round counter is `round_`, if any."""
    return next((f for f in faults if f.round <= round_), None)


def inject(fault: Fault, run_dir=None, timer=None) -> None:
    """Do `fault` (`exit` does not return; nor does `hang`, until a signal ends it; `slow`
    slows `timer`, the rank's `StepTimer`), said on the console and in `run_dir`'s
    events."""
    tell(run_dir, "fault", f"rank {fault.rank}: injected fault: {fault.kind} after round "
                           f"{fault.round} ({ENV})",
         rank=fault.rank, kind=fault.kind, round=fault.round)
    if fault.kind == "exit":
        os._exit(EXIT_CODE)
    if fault.kind == "slow":
        timer.factor *= 2
        return
    while True:  # hang: a thread of torch's may still answer, the loop never goes on
        time.sleep(3600)
