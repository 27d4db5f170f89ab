"""`esync`: ESync (Li et al., IEEE TSC 2020) — local steps sized to the slowest worker.

Per round, on every worker:

1. local SGD steps with the local learning rate (`-ll`). When the round begins the worker reports
   its step time (the median of its recent steps) to the state server and takes its first step
   while the answer travels: the time left until the slowest worker finishes its one step, or
   "stop after one step" for the slowest (`hetsync.state.policy`: one query per round, off the
   critical path). After each step the worker checks, on its own clock, that one more step
   still fits in that time;
2. when those steps are done, wait for every worker (barrier, timed as `wait`);
3. all-reduce the weight deltas Δ = w_local − w_global (with the BatchNorm running statistics
   and the control vector in the same buffer) over the chosen collective;
4. w_global ← w_global + global_lr · mean(Δ) everywhere; BatchNorm statistics ← their mean;
   every worker continues from w_global.

Unlike the original, no batch is drawn and thrown away when the worker is told to stop: the
decision is made after a step, not before the next one. The local optimizer's momentum (0 by
default, as in ESync) stays local.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Callable

import torch

from hetsync.algorithms.base import Algorithm, bn_statistics, flatten, pack, unflatten_into
from hetsync.state.policy import Decision, would_overrun


class ESync(Algorithm):
    name = "esync"
    WINDOW = 9  # step time c = median of the last WINDOW steps: the round's first step, which
    #             every worker takes at once on shared cores, is not the typical one

    def __init__(self, model, optimizer, comm, *, state_client, global_lr: float = 1.0,
                 device_name: str = ""):
        super().__init__(model, optimizer, comm)
        if global_lr <= 0:
            raise ValueError(f"global_lr must be > 0, got {global_lr}")
        self.state, self.global_lr, self.device_name = state_client, global_lr, device_name
        self.local_steps = 0
        self._deadline: float | None = None  # local clock: when the slowest should finish
        self._epsilon = 0.0
        self.step_time: float | None = None  # c, robust to a single slow step
        self._recent: deque[float] = deque(maxlen=self.WINDOW)
        self._global: torch.Tensor | None = None
        self._plan: Callable[[], Decision] | None = None  # reads the server's answer
        self._asked = 0.0

    def setup(self) -> None:
        self.broadcast_model()
        self._global = flatten(self.parameters()).clone()

    def begin_step(self) -> None:
        """At the round's first step: report (no step time yet: a warm-up round, no report)."""
        if self.local_steps == 0 and self._plan is None and self.step_time is not None:
            self._asked = time.perf_counter()
            self._plan = self.state.report_async(self.comm.rank, self.round, 0,
                                                 max(self.step_time, 1e-6),
                                                 self.device_name)

    def local_step(self) -> None:
        self.optimizer.step()
        self.local_steps += 1

    def wants_sync(self, step_time: float) -> bool:
        self._recent.append(step_time)
        c = self.step_time = statistics.median(self._recent)
        if self._deadline is None:  # the round's first step
            if self._plan is None:
                return True  # warm-up: aggregate after one step
            with self.comm.clock.phase("query"):  # only what the first step did not hide
                decision = self._plan()
            self._plan = None
            if decision.ready or decision.time_left is None:
                return True
            # `time_left` was measured when the server got the report: after `_asked`.
            self._deadline, self._epsilon = self._asked + decision.time_left, decision.epsilon
        return would_overrun(c, self._deadline - time.perf_counter(), self._epsilon)

    def synchronize(self, control: torch.Tensor | None = None) -> torch.Tensor | None:
        params, stats = self.parameters(), bn_statistics(self.model)
        local = flatten(params)
        buffer = pack([local - self._global] + stats, control)
        self.comm.wait_for_peers()
        buffer = self.comm.all_reduce(buffer)
        n_delta, n_stats = local.numel(), sum(s.numel() for s in stats)
        self._global.add_(buffer[:n_delta], alpha=self.global_lr / self.comm.workers)
        unflatten_into(self._global, params)
        if stats:
            unflatten_into(buffer[n_delta:n_delta + n_stats] / self.comm.workers, stats)
        self.round += 1
        self.local_steps, self._deadline = 0, None
        return None if control is None else buffer[n_delta + n_stats:]

    def finish(self) -> None:
        self._plan = None  # a report of a round that will not run: its answer is not read
        super().finish()
