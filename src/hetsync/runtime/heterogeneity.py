"""Emulated heterogeneity: a worker that runs `factor` times slower than the device it is on.

ESync's own emulation (its `dev` branch, `-f`) sleeps (F − 1) × the measured compute time after
every step. On a machine whose cores are shared by the emulated workers (four workers on two
cores here), the wall time of a step also holds the time the process stood preempted by its
neighbours, and the sleep multiplies that noise by F − 1: the slowest worker of speeds 1, 2, 4, 8
saw its steps vary threefold, and a rule sized to it (ESync's readiness) cannot be right.

So the device's own work is measured as the CPU time the process used during the step (on a CPU
device; on a GPU the step's wall time after `cuda.synchronize`), its typical value is the median
of the last `WINDOW` steps (the CPU time of a step on shared cores still varies with its
neighbours' cache traffic), and the sleep tops the step up to F × that:

    work  = median of min(cpu, wall) over the last WINDOW steps   (CPU device; wall on a GPU)
    sleep = max(0, F · work − wall)

Uncontended and steady (cpu = wall = work) this is ESync's (F − 1) × work. Contended, a slow
emulated device keeps its speed, as a real one would (it has its own cores); an F = 1 worker
never sleeps, so it keeps whatever contention it meets, as a real shared device does.
"""

from __future__ import annotations

import statistics
import time
from collections import deque


def emulated_sleep(factor: float, wall: float, work: float) -> float:
    """Seconds to sleep after a step that took `wall` seconds so that it lasts `factor` times
    the device's typical `work` per step (never negative: a step already longer is not cut)."""
    if factor < 1:
        raise ValueError(f"slowdown factor must be >= 1, got {factor}")
    return max(0.0, factor * work - wall)


class StepTimer:
    """Times one step on the wall clock and the process's CPU clock, and emulates its slowdown.

    `begin()` before the step's data; `emulate()` after its local update (and after
    `cuda.synchronize`): sleeps as `emulated_sleep` says for the typical work, once per step.
    """

    WINDOW = 16

    def __init__(self, factor: float = 1.0, cpu_device: bool = True):
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        self.factor, self.cpu_device = factor, cpu_device
        self.started = self._cpu_started = 0.0
        self._slept = False
        self._work: deque[float] = deque(maxlen=self.WINDOW)

    def begin(self) -> float:
        self.started, self._cpu_started = time.perf_counter(), time.process_time()
        self._slept = False
        return self.started

    def emulate(self) -> None:
        if self._slept or self.factor <= 1:
            return
        self._slept = True
        wall = time.perf_counter() - self.started
        cpu = time.process_time() - self._cpu_started if self.cpu_device else None
        self._work.append(wall if cpu is None else min(cpu, wall))
        time.sleep(emulated_sleep(self.factor, wall, statistics.median(self._work)))
