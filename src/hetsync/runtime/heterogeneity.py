"""Emulated heterogeneity: a worker that runs `factor` times slower than the device it is on.

ESync's own emulation (its `dev` branch, `-f`) sleeps (F − 1) × the measured compute time after
every step. On a machine whose cores are shared by the emulated workers (four workers on two
cores here), the wall time of a step also holds the time the process stood preempted by its
neighbours, and the sleep multiplies that noise by F − 1: the slowest worker of speeds 1, 2, 4, 8
saw its steps vary threefold, and a rule sized to it (ESync's readiness) cannot be right.

So the device's own work is measured as the CPU time the step used (on a CPU device; on a GPU
the step's wall time after `cuda.synchronize`): the calling thread's when torch computes on one
thread (hetsync's default), so that a communication thread's work in the background (ESync's
overlap, gloo's own threads) is not taken for the device's; else the process's. Its typical
value is the median of the first `CALIBRATION` steps (the CPU time of a step on shared cores
still varies with its neighbours' cache traffic), and the sleep tops the step up to F × that:

    work  = median of min(cpu, wall) over the first CALIBRATION steps   (CPU; wall on a GPU)
    sleep = max(0, F · work − wall) − what earlier sleeps overran (at most F · work)

A sleep wakes late where cores are shared (the three slower of four emulated devices on two
cores ran at 93-95 % of their nominal speed, where the step's own work had left time to
spare); a real device computes on, so the overrun is taken off the next sleeps and the device
keeps its speed.

The work is then held: an emulated device runs at one speed, as a real one does, instead of
following its neighbours' load (which drifts by ±8 % over seconds here, and independently on
each worker: speeds of exactly 1 : 2 : 4 : 8 would wander across the boundary at which a
worker's last step fits in the slowest's).

Uncontended and steady (cpu = wall = work) this is ESync's (F − 1) × work. Contended, a slow
emulated device keeps its speed, as a real one would (it has its own cores); an F = 1 worker
never sleeps, so it keeps whatever contention it meets, as a real shared device does.

`launch` and `bench` give every worker the same reference `work` instead, measured before the
workers start, alone and warm (`runtime/emulation.py`): a worker's own first steps are slower
(a cold start, and a device that sleeps most of its time computes on a cold cache at a lower
clock: alone, a slowdown-15 LeNet worker measured 1.3x the reference work and ran 23 % below
its nominal speed, at 99 % of it with the reference's), and the devices of one cluster, and of
every run of a bench, should run at the speeds they are said to.

**On a virtual clock** (`hetsync.clock`) nothing sleeps: a step costs the device's time for
it, spent on the worker's virtual clock — F × the reference work × the step's share of the
device's batch, times a seeded jitter draw where `--step-jitter` σ > 0 (lognormal of mean 1,
as FedScale draws a client's duration, or half-normal, 1 + σ|z|, as FLSim does), plus a
straggler's delay. A device of a profile (`hetsync.clock.profile`) also has a fixed part per
step, whatever its batch (`fixed`): only the rest scales with the step's samples. The reference work is
then always given (`launch` and `bench` measure it once before the workers start), so a run's
times do not depend on how fast this machine computes its steps.

**Random stragglers** (`RandomStraggler`), as eager-SGD's paper injects imbalance: every step,
every worker independently sleeps a fixed delay with probability p (the paper: 320 ms on a
~0.3 s step with p ≈ 2/P; its code draws `rank == randint(P) or rank == randint(P)` from a
shared seed, which in effect is that). The delay is in seconds, or a multiple of the worker's
typical step (`4x`). It comes on top of `--slowdowns`, in every mode.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass

import torch

from hetsync.options import parse_delay


def emulated_sleep(factor: float, wall: float, work: float) -> float:
    """Seconds to sleep after a step that took `wall` seconds so that it lasts `factor` times
    the device's typical `work` per step (never negative: a step already longer is not cut)."""
    if factor < 1:
        raise ValueError(f"slowdown factor must be >= 1, got {factor}")
    return max(0.0, factor * work - wall)


@dataclass(frozen=True)
class RandomStraggler:
    """Each step, sleep `delay` with probability `prob` (`relative`: `delay` × the typical
    step's work). Draws from its own seeded generator, independently on every worker."""

    prob: float
    delay: float
    relative: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.prob <= 1:
            raise ValueError(f"straggler probability must be in [0, 1], got {self.prob}")
        if not 0 <= self.delay < float("inf"):
            raise ValueError(f"straggler delay must be >= 0, got {self.delay}")

    def draws(self):
        """The delay of each step in turn (seconds, or a multiple of the typical work)."""
        rng = random.Random(self.seed)
        while True:
            yield self.delay if rng.random() < self.prob else 0.0


def straggler_of(cfg, rank: int) -> RandomStraggler | None:
    """Worker `rank`'s random straggler of the run `cfg` (None when --straggle-prob is 0)."""
    if cfg.straggle_prob == 0:
        return None
    delay, relative = parse_delay(cfg.straggle_delay)
    return RandomStraggler(cfg.straggle_prob, delay, relative,
                           seed=cfg.seed * 7919 + 104729 * (rank + 1))


class StepTimer:
    """Times one step on the wall clock and a CPU clock, and emulates its slowdown.

    `begin()` before the step's data; `emulate(share)` after its backward (and after
    `cuda.synchronize`): sleeps as `emulated_sleep` says for the typical work (`work`, when
    given: the reference device's) × `share`, the step's samples ÷ the device's own batch (a
    lost worker's batch of another size, `runtime/shards.py`, takes its own samples' time),
    and a random straggler's delay if one is drawn, once per step.
    """

    CALIBRATION = 32

    def __init__(self, factor: float = 1.0, cpu_device: bool = True,
                 straggler: RandomStraggler | None = None, work: float | None = None,
                 clock=None, jitter: float = 0.0, seed: int = 0,
                 jitter_distribution: str = "lognormal", fixed: float = 0.0):
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        if work is not None and not work > 0:
            raise ValueError(f"the reference work per step must be > 0 s, got {work}")
        #: a virtual clock (`hetsync.clock.VirtualClock`) to spend the step's time on, or
        #: None: the wall clock, slept to
        self.clock = clock if clock is not None and clock.virtual else None
        if self.clock is not None and work is None:
            raise ValueError("a device on the virtual clock needs the reference work per step "
                             "(--step-work)")
        if not 0 <= jitter < float("inf"):
            raise ValueError(f"the step jitter must be >= 0, got {jitter}")
        if jitter_distribution not in ("lognormal", "half-normal"):
            raise ValueError(f"the step jitter's distribution must be lognormal or "
                             f"half-normal, got {jitter_distribution!r}")
        if not 0 <= fixed <= factor * (work or 0.0) + 1e-12 and fixed:
            raise ValueError(f"a step's fixed part ({fixed} s) must be in [0, its whole time]")
        self._jitter, self._distribution, self.fixed = jitter, jitter_distribution, fixed
        self._rng = random.Random(seed)
        self.factor, self.cpu_device = factor, cpu_device
        #: the reference work per step, fixed (None: the median of the first steps)
        self.work = work
        self.straggler = straggler
        self._delays = straggler.draws() if straggler is not None and straggler.prob > 0 \
            else None
        self._cpu_clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
        self.started = self._cpu_started = 0.0
        self._slept = False
        self._typical = work or 0.0
        self._work: list[float] = []
        #: seconds the sleeps overran so far, made up by the next ones (at most one step's)
        self._late = 0.0

    def begin(self) -> float:
        now = self.clock.now() if self.clock is not None else time.perf_counter()
        self.started, self._cpu_started = now, self._cpu_clock()
        self._slept = False
        return self.started

    def virtual_seconds(self, share: float = 1.0) -> float:
        """A step's time on the virtual clock: (fixed + (F × work − fixed) × share) × jitter
        + a straggler's delay (the module docstring)."""
        seconds = self.fixed + (self.factor * self.work - self.fixed) * share
        if self._jitter > 0:
            z = self._rng.gauss(0.0, 1.0)
            seconds *= (1 + self._jitter * abs(z) if self._distribution == "half-normal"
                        else math.exp(self._jitter * z - self._jitter ** 2 / 2))  # mean 1
        return seconds + self._straggle(self.work)

    def _straggle(self, work: float) -> float:
        """This step's random straggler delay, in seconds (0: none drawn, or no straggler);
        a relative delay is a multiple of the device's step of `work`."""
        if self._delays is None:
            return 0.0
        delay = next(self._delays)
        return delay * (self.factor * work if self.straggler.relative else 1.0)

    def emulate(self, share: float = 1.0) -> None:
        if self._slept:
            return
        if self.clock is not None:
            self._slept = True
            self.clock.spend(self.virtual_seconds(share))
            return
        if self.factor <= 1 and self._delays is None:
            return
        self._slept = True
        now = time.perf_counter()
        wall = now - self.started
        cpu = self._cpu_clock() - self._cpu_started if self.cpu_device else None
        if self.work is None and len(self._work) < self.CALIBRATION and share > 0:
            self._work.append((wall if cpu is None else min(cpu, wall)) / share)
            self._typical = statistics.median(self._work)
        sleep = emulated_sleep(self.factor, wall, self._typical * share)
        sleep += self._straggle(self._typical)
        # A sleep wakes late (by a scheduler's tick where cores are shared); a real device
        # computes on: the overrun is taken off the next sleeps, so the device keeps its speed.
        owed = min(self._late, sleep)
        end = now + sleep - owed
        time.sleep(sleep - owed)
        self._late = min(self._late - owed + max(0.0, time.perf_counter() - end),
                         self.factor * self._typical * share)
