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
    sleep = max(0, F · work − wall)

The work is then held: an emulated device runs at one speed, as a real one does, instead of
following its neighbours' load (which drifts by ±8 % over seconds here, and independently on
each worker: speeds of exactly 1 : 2 : 4 : 8 would wander across the boundary at which a
worker's last step fits in the slowest's).

Uncontended and steady (cpu = wall = work) this is ESync's (F − 1) × work. Contended, a slow
emulated device keeps its speed, as a real one would (it has its own cores); an F = 1 worker
never sleeps, so it keeps whatever contention it meets, as a real shared device does.
"""

from __future__ import annotations

import statistics
import time

import torch


def emulated_sleep(factor: float, wall: float, work: float) -> float:
    """Seconds to sleep after a step that took `wall` seconds so that it lasts `factor` times
    the device's typical `work` per step (never negative: a step already longer is not cut)."""
    if factor < 1:
        raise ValueError(f"slowdown factor must be >= 1, got {factor}")
    return max(0.0, factor * work - wall)


class StepTimer:
    """Times one step on the wall clock and a CPU clock, and emulates its slowdown.

    `begin()` before the step's data; `emulate()` after its local update (and after
    `cuda.synchronize`): sleeps as `emulated_sleep` says for the typical work, once per step.
    """

    CALIBRATION = 32

    def __init__(self, factor: float = 1.0, cpu_device: bool = True):
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        self.factor, self.cpu_device = factor, cpu_device
        self._cpu_clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
        self.started = self._cpu_started = 0.0
        self._slept = False
        self._typical = 0.0
        self._work: list[float] = []

    def begin(self) -> float:
        self.started, self._cpu_started = time.perf_counter(), self._cpu_clock()
        self._slept = False
        return self.started

    def emulate(self) -> None:
        if self._slept or self.factor <= 1:
            return
        self._slept = True
        wall = time.perf_counter() - self.started
        cpu = self._cpu_clock() - self._cpu_started if self.cpu_device else None
        if len(self._work) < self.CALIBRATION:
            self._work.append(wall if cpu is None else min(cpu, wall))
            self._typical = statistics.median(self._work)
        time.sleep(emulated_sleep(self.factor, wall, self._typical))
