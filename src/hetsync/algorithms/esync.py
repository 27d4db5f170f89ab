"""`esync`: ESync (Li et al., IEEE TSC 2020) — local steps sized to the slowest worker.

Per round, on every worker:

1. local SGD steps with the local learning rate (`-ll`), as many as the state server planned:
   as many as fit in the slowest worker's one step (the round's planned length), one for the
   slowest (`hetsync.state.policy`). After each step the worker checks, on its own clock, that
   one more step still fits in the time left;
2. when those steps are done, report the step time (the median of the recent steps) for the
   next round; the answer is read after that round's first step (one query per round, off the
   critical path);
3. all-reduce the weight deltas Δ = w_local − w_global, with the BatchNorm running statistics
   and the training loop's control vector in the same buffer, over the chosen collective;
4. w_global ← w_global + global_lr · mean(Δ) everywhere; BatchNorm statistics ← their mean.

ESync as published (`overlap=False`) waits for every worker at a barrier (timed as `wait`)
before step 3 and continues from w_global. hetsync's default (`overlap=True`) never idles a
worker that has finished its steps: it hands step 3 to a background thread and goes on with
the next round's steps at once; when the sum is in (checked after every step) it applies step 4
keeping what it learnt meanwhile, w_local ← w_global + (w_local − w_sent), as CoCoD-SGD does
(Shen et al., "Faster Distributed Deep Net Training: Computation and Communication Decoupled
SGD", IJCAI 2019). Both the wait for the slowest worker and the transfer are thus spent
computing; the price is that the steps taken meanwhile start from the worker's own model
rather than the average (one round of staleness at most). A worker that finishes a round while
the previous sum is still in flight waits for it (timed as `wait`), so no worker runs more
than a round ahead. Evaluation sees w_global (`global_model`), and the model kept at the end
is w_global.

Unlike the original, no batch is drawn and thrown away when the worker is told to stop: the
decision is made after a step, not before the next one. The local optimizer's momentum (0 by
default, as in ESync) stays local.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from hetsync.algorithms.base import Algorithm, bn_statistics, flatten, pack, unflatten_into
from hetsync.state.policy import Decision, would_overrun


class ESync(Algorithm):
    name = "esync"
    WINDOW = 9  # step time c = median of the last WINDOW steps: the round's first step, which
    #             every worker takes at once on shared cores, is not the typical one

    def __init__(self, model, optimizer, comm, *, state_client, global_lr: float = 1.0,
                 device_name: str = "", overlap: bool = True):
        super().__init__(model, optimizer, comm)
        if global_lr <= 0:
            raise ValueError(f"global_lr must be > 0, got {global_lr}")
        self.state, self.global_lr, self.device_name = state_client, global_lr, device_name
        self.overlap = overlap
        self.local_steps = 0
        self._deadline: float | None = None  # local clock: when the round should end
        self._planned = 0  # the steps the server planned for this round
        self._epsilon = 0.0
        self.step_time: float | None = None  # c, robust to a single slow step
        self._recent: deque[float] = deque(maxlen=self.WINDOW)
        self._global: torch.Tensor | None = None
        self._plan: Callable[[], Decision] | None = None  # reads the server's answer
        # the aggregation in flight (overlap): the sum's future, and what this worker sent
        self._pending: Future | None = None
        self._sent: tuple[torch.Tensor, torch.Tensor] | None = None  # (w_local, BN stats)
        self._global_stats: torch.Tensor | None = None

    def setup(self) -> None:
        self.broadcast_model()
        self._global = flatten(self.parameters()).clone()
        stats = bn_statistics(self.model)
        self._global_stats = pack(stats).clone() if stats else None

    def local_step(self) -> None:
        self.optimizer.step()
        self.local_steps += 1

    def wants_sync(self, step_time: float) -> bool:
        step_started = time.perf_counter() - step_time
        if self._pending is not None and self._pending.done():
            self.settle()
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
            # `time_left` counts from the round's start: its first step's, on this clock.
            self._deadline = step_started + decision.time_left
            self._epsilon = decision.epsilon
            self._planned = decision.steps_left  # the report was made at k = 0
        # A planned step may overrun the round by the server's margin (it was planned: it
        # only ran slow); one beyond the plan (the steps ran fast) must fit in the time left.
        margin = self._epsilon if self.local_steps < self._planned else 0.0
        return would_overrun(c, self._deadline - time.perf_counter(), margin)

    def synchronize(self, control: torch.Tensor | None = None) -> None:
        self.settle()  # the previous round's sum, if it is still in flight
        params, stats = self.parameters(), bn_statistics(self.model)
        local = flatten(params)
        sent_stats = pack(stats) if stats else torch.zeros(0)
        # The report for the next round leaves now; its answer is read after that round's
        # first step.
        self._plan = self.state.report_async(self.comm.rank, self.round + 1, 0,
                                             max(self.step_time, 1e-6), self.device_name)
        self._sent = (local, sent_stats)
        tail = [] if control is None else [control.to(local.dtype)]
        buffer = torch.cat([local - self._global, sent_stats] + tail)
        if self.overlap:
            self._pending = self.comm.start_all_reduce(buffer)
        else:
            self.comm.wait_for_peers()
            self._apply(self.comm.all_reduce(buffer))
        self.round += 1
        self.local_steps, self._deadline = 0, None

    def settle(self) -> None:
        """Apply the sum in flight, waiting for it if need be (timed as `wait`: a worker
        blocks here only while a slower one has not sent its delta yet)."""
        if self._pending is None:
            return
        with self.comm.clock.phase("wait"):
            summed, self._pending = self._pending.result(), None
            self._apply(summed)

    def _apply(self, summed: torch.Tensor) -> None:
        """w_global += global_lr · mean(Δ); w_local ← w_global + what was learnt since the
        send (nothing without `overlap`); BN statistics likewise; the control's sum is kept
        for `agreed_control`."""
        (sent, sent_stats), self._sent = self._sent, None
        params, stats = self.parameters(), bn_statistics(self.model)
        n, m = sent.numel(), sent_stats.numel()
        self._global.add_(summed[:n], alpha=self.global_lr / self.comm.workers)
        unflatten_into(self._global + (flatten(params) - sent), params)
        if stats:
            self._global_stats = summed[n:n + m] / self.comm.workers
            unflatten_into(self._global_stats + (pack(stats) - sent_stats), stats)
        self._control = summed[n + m:]

    @contextmanager
    def global_model(self) -> Iterator[None]:
        """Hold w_global (and the global BN statistics) in the model meanwhile."""
        stats = bn_statistics(self.model)
        local = (flatten(self.parameters()), pack(stats) if stats else None)
        self._load(self._global, self._global_stats)
        try:
            yield
        finally:
            self._load(*local)

    def _load(self, weights: torch.Tensor, stats: torch.Tensor | None) -> None:
        unflatten_into(weights, self.parameters())
        if stats is not None:
            unflatten_into(stats, bn_statistics(self.model))

    def finish(self) -> None:
        self._plan = None  # a report of a round that will not run: its answer is not read
        super().finish()
        # The steps taken since the last send are in no average: keep the global model.
        self._load(self._global, self._global_stats)
