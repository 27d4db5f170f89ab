"""`esync`: ESync (Li et al., IEEE TSC 2020) — local steps sized to the slowest worker.

Per round, on every worker:

1. local SGD steps with the local learning rate (`-ll`); after its first step the worker reports
   its step time (an EWMA over its recent steps) to the state server, which answers with the time left until the slowest worker
   finishes its one step (`hetsync.state.policy`: one query per round); before each further step
   the worker checks, on its own clock, that one more step still fits in that time;
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

import time

import torch

from hetsync.algorithms.base import Algorithm, bn_statistics, flatten, pack, unflatten_into
from hetsync.state.policy import would_overrun


class ESync(Algorithm):
    name = "esync"
    SMOOTHING = 0.5  # weight of the newest step in the step-time estimate (an EWMA)

    def __init__(self, model, optimizer, comm, *, state_client, global_lr: float = 1.0,
                 device_name: str = ""):
        super().__init__(model, optimizer, comm)
        if global_lr <= 0:
            raise ValueError(f"global_lr must be > 0, got {global_lr}")
        self.state, self.global_lr, self.device_name = state_client, global_lr, device_name
        self.local_steps = 0
        self._deadline: float | None = None  # local clock: when the slowest should finish
        self._epsilon = 0.0
        self.step_time: float | None = None  # smoothed: one slow step is not the new normal
        self._global: torch.Tensor | None = None

    def setup(self) -> None:
        self.broadcast_model()
        self._global = flatten(self.parameters()).clone()

    def local_step(self) -> None:
        self.optimizer.step()
        self.local_steps += 1

    def wants_sync(self, step_time: float) -> bool:
        c = step_time if self.step_time is None else (
            self.SMOOTHING * step_time + (1 - self.SMOOTHING) * self.step_time)
        self.step_time = c
        if self._deadline is None:
            asked = time.perf_counter()
            with self.comm.clock.phase("query"):
                decision = self.state.report(self.comm.rank, self.round, self.local_steps,
                                             max(c, 1e-6), self.device_name)
            if decision.ready or decision.time_left is None:
                return True
            # `time_left` was measured when the server got the report: at the latest, now.
            self._deadline, self._epsilon = asked + decision.time_left, decision.epsilon
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
