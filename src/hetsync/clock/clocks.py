"""The clock a worker's run is timed by: the wall clock, or a virtual one.

Every time the training loop, the records and the modes read — a step's start and end, the
phases of a round (`wait`, `comm`, ...), the training time that decides evaluations and the
stop — comes from the worker's clock (`PhaseClock.now`, `hetsync.algorithms.base`), so the same
code runs on either:

- `WallClock`: `time.perf_counter`. An emulated device sleeps to its nominal speed
  (`runtime/heterogeneity.py`), and a collective takes what it takes.
- `VirtualClock`: time from a model, gradients real. The clocks of the workers are numbers
  that move only by what the model says:

  1. a step of the device costs its modelled time (`StepTimer`: the reference step × the
     device's slowdown × the step's share of its batch, times a seeded jitter draw, plus a
     straggler's delay), spent with `spend` instead of slept;
  2. a blocking collective over a group is also a meeting of their clocks (`meet`): every
     member leaves it at the latest member's time plus the collective's cost on the links it
     crosses (`network.py`), the max taken by an all-reduce of one float64 with `MAX` over the
     same group (not counted by the byte meter: it is the clock's, not the run's);
  3. a collective handed to the background channel (`background`) starts at the latest
     member's time of submission, or when the channel's previous job ended if that is later,
     and ends its cost after; the main thread's `VirtualFuture` is done once its clock has
     passed that end, and waiting for it moves the clock there — so overlapped communication
     costs time only where it is waited for.

  A run on the virtual clock is deterministic: nothing it records depends on how fast this
  machine computes, only on the seed, the devices and the links. What the real machine does
  decide is how long the simulation takes (its devices' real compute, step after step).

The reference of the method: HALoS (ICML 2025) and FLSim time their workers the same way — a
device's compute as reference time × steps ÷ speed, a message as bytes ÷ bandwidth; hetsync's
departs in running every worker as its own process on real torch.distributed groups and
deciding each order by the clocks' meetings, not by a central event heap, so every mode runs its
own code.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from .network import Link, all_reduce_seconds


class WallClock:
    """Real time (`time.perf_counter`); meetings cost nothing extra (the collective itself
    took its time)."""

    kind = "wall"
    virtual = False

    def now(self) -> float:
        return time.perf_counter()

    def meet(self, group, seconds: float, device: torch.device | None = None) -> None:
        return None

    def background(self, future):
        return future

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}


class VirtualClock:
    """A worker's virtual clock (the module docstring): starts at 0, moves by `spend` and
    `meet`; `link` prices the collectives the worker takes part in."""

    kind = "virtual"
    virtual = True

    def __init__(self, link: Link | None = None, timeout: float = 120.0,
                 server_s_per_byte: float = 0.0):
        self.link = link or Link()
        self.timeout = timeout
        #: the parameter server's work per byte it receives or sends (`--server-work`)
        self.server_s_per_byte = server_s_per_byte
        self._t = 0.0
        #: when the background channel's last job ended (its thread's alone)
        self._channel_free = 0.0

    def now(self) -> float:
        return self._t

    def spend(self, seconds: float) -> None:
        """The device works for `seconds` (a step's modelled time)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._t += seconds

    def arrive(self, t: float) -> None:
        """A message this worker waited for arrives at `t` (if later than now)."""
        self._t = max(self._t, t)

    def latest(self, t: float, group, device: torch.device | None = None) -> float:
        """The largest of `t` over `group`'s members (every member calls this, in the same
        order as its other collectives on `group`)."""
        if group is None and not (dist.is_available() and dist.is_initialized()):
            return t
        if group is not None and dist.get_world_size(group) <= 1:
            return t
        times = torch.tensor([t], dtype=torch.float64, device=device)
        work = dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        return float(times.item())

    def all_reduce_seconds(self, algorithm: str, workers: int, nbytes: float) -> float:
        """What a sum of `nbytes` over `workers` costs on this clock's link (and server)."""
        return all_reduce_seconds(algorithm, workers, nbytes, self.link, self.server_s_per_byte)

    def meet(self, group, seconds: float, device: torch.device | None = None) -> None:
        """A blocking collective over `group` that costs `seconds` on the links: every
        member leaves at the latest member's time plus that."""
        self._t = self.latest(self._t, group, device) + seconds

    def job_end(self, group, sent: float, seconds: float,
                device: torch.device | None = None) -> float:
        """In the channel's thread, after a job's collective: when it ended on the virtual
        clock (`sent`: this member's clock when it submitted the job)."""
        start = max(self.latest(sent, group, device), self._channel_free)
        self._channel_free = start + seconds
        return self._channel_free

    def background(self, future) -> "VirtualFuture":
        """The main thread's view of a channel job that returns (value, `job_end`)."""
        return VirtualFuture(future, self)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "latency_s": self.link.latency_s,
                "bandwidth_bps": self.link.bandwidth_bps}


class VirtualFuture:
    """A channel job's future on the virtual clock: its job returns (value, end); it is done
    once the clock has passed `end`, and waiting for it moves the clock there."""

    def __init__(self, future, clock: VirtualClock):
        self._future, self._clock = future, clock
        self.what = getattr(future, "what", "")

    def _value_and_end(self, within: float | None = None) -> tuple[Any, float]:
        return self._future.result() if within is None else self._future.result(within)

    def done(self) -> bool:
        # The order must not depend on how fast the others compute for real: the job is
        # waited for (in real time) to learn when it ends on the virtual clock.
        _, end = self._value_and_end()
        return end <= self._clock.now()

    def result(self, within: float | None = None) -> Any:
        value, end = self._value_and_end(within)
        self._clock._t = max(self._clock._t, end)
        return value
