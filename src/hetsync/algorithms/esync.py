"""`esync`: ESync (Li et al., IEEE TSC 2020) — local steps sized to the slowest worker.

Per round, on every worker:

1. local SGD steps with the local learning rate (`-ll`), as many as the state server planned:
   as many as fit in the slowest worker's one step (the round's planned length), one for the
   slowest (`hetsync.state.policy`). After each step the worker decides, on its own clock,
   whether one more step still fits in the time left (`decide`, pure);
2. when those steps are done, report the step time (the median of the recent steps) for the
   next round; the answer is read after that round's first step (`poll`: one query per round,
   off the critical path);
3. all-reduce the weight deltas Δ = w_local − w_global, with the BatchNorm running statistics
   in the same buffer, over the chosen collective;
4. w_global ← w_global + global_lr · mean(Δ) everywhere; BatchNorm statistics ← their mean.

ESync as published (`overlap=False`) waits for every worker at a barrier (the training loop's
blocking agreement, timed as `wait`) before step 3 and continues from w_global. hetsync's
default (`overlap=True`) never idles a worker that has finished its steps: it hands step 3 to
the worker's background channel (`hetsync.comm.channel`) and goes on with the next round's
steps at once; when the sum is in (checked after every step) it applies step 4
keeping what it learnt meanwhile, w_local ← w_global + (w_local − w_sent), as CoCoD-SGD does
(Shen et al., "Faster Distributed Deep Net Training: Computation and Communication Decoupled
SGD", IJCAI 2019). Both the wait for the slowest worker and the transfer are thus spent
computing; the price is that the steps taken meanwhile start from the worker's own model
rather than the average (one round of staleness at most). A worker that finishes a round while
the previous sum is still in flight waits for it (timed as `wait`), so no worker runs more
than a round ahead. Evaluation sees w_global (`global_model`), and the model kept at the end
is w_global.

The global update of step 4 is an outer optimizer over a weighting of the deltas
(`hetsync.algorithms.outer`); `--drift-correction scaffold` adds SCAFFOLD's control variates
to every local step and to the round's all-reduce (`hetsync.algorithms.scaffold`; with
blocking rounds only).

Unlike the original, no batch is drawn and thrown away when the worker is told to stop: the
decision is made after a step, not before the next one. The local optimizer's momentum (0 by
default, as in ESync) stays local. A step's time is its data, forward, backward and emulated
slowdown; the local update that follows it (a small fraction of a step) is not in it.
"""

from __future__ import annotations

import secrets
import statistics
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from hetsync.algorithms.base import (Action, ControlPath, Mode, Step, bn_statistics, flatten,
                                     pack, unflatten_into, with_count)
from hetsync.algorithms.outer import WEIGHTINGS, OuterOptimizer, combine, contribution
from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.scaffold import DRIFT_CORRECTIONS, ControlVariates
from hetsync.state.policy import Decision, would_overrun


@dataclass
class ESyncOptions:
    """ESync's own options."""

    local_lr: float | None = field(default=None, metadata={
        "flags": ("-ll", "--local-lr"), "help": "ESync local learning rate (default: -l)"})
    global_lr: float | None = field(default=None, metadata={
        "flags": ("-gl", "--global-lr"),
        "help": "global (outer) learning rate on the combined weight delta (default: 1 for "
                "esync, 0.7 for esync-outer)"})
    outer_momentum: float | None = field(default=None, metadata={
        "flags": ("--outer-momentum",),
        "help": "Nesterov momentum of the global update (default: 0 for esync, 0.9 for "
                "esync-outer)"})
    weighting: str | None = field(default=None, metadata={
        "flags": ("--weighting",),
        "help": "how the workers' deltas combine: uniform (the mean), samples (by local "
                "steps), fednova (normalised averaging; for non-IID data) (default: "
                "uniform)"})
    drift_correction: str | None = field(default=None, metadata={
        "flags": ("--drift-correction",),
        "help": "none, or scaffold: control variates correct each local step towards the "
                "global gradient (SCAFFOLD, for non-IID data; with --overlap 0; a second "
                "model-sized vector in each round's all-reduce) (default: none)"})
    epsilon: float | None = field(default=None, metadata={
        "flags": ("--epsilon",), "parser": "epsilon",
        "help": "ESync readiness margin ε, a fraction of the caller's step time c: stop when "
                "c(1+ε) > the slowest's time left; auto: the round length that keeps the "
                "workers busiest, a planned step may overrun it by c/P"})
    overlap: bool = field(default=True, metadata={
        "flags": ("--overlap",),
        "help": "ESync: sum the weight deltas in the background while the next round's first "
                "steps run (0/1; 0: ESync as published) (default: 1; esync-outer on a "
                "non-IID partition: 0)"})
    max_local_steps: int = field(default=0, metadata={
        "flags": ("--max-local-steps",),
        "help": "end a worker's round after at most N local steps; a faster worker then "
                "waits for the slowest's sum (with --overlap 1: after its next round's steps): "
                "less client drift on non-IID data, less throughput (0: no limit) (default: "
                "0; esync-outer on a non-IID partition: 4)"})

    def validate(self) -> "ESyncOptions":
        from hetsync.config import invalid_option

        if self.local_lr is not None and not (0 < self.local_lr < float("inf")):
            raise invalid_option(self, "local_lr", "a finite number > 0")
        if self.global_lr is not None and not 0 < self.global_lr < float("inf"):
            raise invalid_option(self, "global_lr", "a finite number > 0")
        if self.outer_momentum is not None and not 0 <= self.outer_momentum < 1:
            raise invalid_option(self, "outer_momentum", "a number in [0, 1)")
        if self.weighting is not None and self.weighting not in WEIGHTINGS:
            raise invalid_option(self, "weighting", " or ".join(WEIGHTINGS))
        if self.drift_correction is not None and self.drift_correction not in DRIFT_CORRECTIONS:
            raise invalid_option(self, "drift_correction", " or ".join(DRIFT_CORRECTIONS))
        if self.drift_correction == "scaffold" and self.overlap:
            # measured: variates a round staler, under the outer momentum, diverged
            raise invalid_option(self, "drift_correction",
                                 "none with --overlap 1 (scaffold needs --overlap 0)")
        if self.epsilon is not None and not -1 < self.epsilon < 1:
            raise invalid_option(self, "epsilon", "auto or a fraction in (-1, 1)")
        if self.max_local_steps < 0:
            raise invalid_option(self, "max_local_steps", "an integer >= 1, or 0 (no limit)")
        return self


def at_step_limit(steps: int, max_local_steps: int) -> bool:
    """Whether a round of `steps` local steps has reached `--max-local-steps` (0: none)."""
    return 0 < max_local_steps <= steps


def global_update(defaults: dict[str, Any], options: ESyncOptions) -> dict[str, Any]:
    """The global update's settings: each option given, else the mode's default."""
    return {k: default if getattr(options, k) is None else getattr(options, k)
            for k, default in defaults.items()}


class ESync(Mode):
    name = "esync"
    counts_contributors = True
    Options = ESyncOptions
    aggregation_pass = True
    #: the global update's defaults (ESync as published: the mean delta, applied at rate 1)
    defaults = {"global_lr": 1.0, "outer_momentum": 0.0, "weighting": "uniform",
                "drift_correction": "none"}
    WINDOW = 9  # step time c = median of the last WINDOW steps: the round's first step, which
    #             every worker takes at once on shared cores, is not the typical one

    def __init__(self, model, optimizer, comm, options: ESyncOptions | None = None):
        super().__init__(model, optimizer, comm, options)
        if comm.state_client is None:
            raise ValueError("mode 'esync' needs a state server client (-ip/-port)")
        self.options.validate()
        self.settings = global_update(self.defaults, self.options)
        self.outer = OuterOptimizer(self.settings["global_lr"], self.settings["outer_momentum"])
        self.weighting = self.settings["weighting"]
        self.variates = (ControlVariates() if self.settings["drift_correction"] == "scaffold"
                         else None)
        self.local_steps = 0
        self._deadline: float | None = None  # local clock: when the round should end
        self._planned = 0  # the steps the server planned for this round
        self._epsilon = 0.0
        self.step_time: float | None = None  # c, robust to a single slow step
        self._recent: deque[float] = deque(maxlen=self.WINDOW)
        self._global: torch.Tensor | None = None
        self._global_stats: torch.Tensor | None = None
        self._plan: Callable[[], Decision] | None = None  # reads the server's answer
        self._answer: Decision | None = None  # read by `poll`, used by the next `decide`
        # the aggregation in flight (overlap): the sum's future, and what this worker sent
        self._pending = None
        self._sent: tuple[torch.Tensor, torch.Tensor] | None = None  # (w_local, BN stats)

    @classmethod
    def optimizer_lr(cls, base_lr: float, options: ESyncOptions) -> float:
        return base_lr if options.local_lr is None else options.local_lr

    @property
    def control(self) -> ControlPath:
        return ControlPath.BACKGROUND if self.options.overlap else ControlPath.BLOCKING

    def setup(self) -> None:
        """Rank 0 draws the run's id and starts the state server's run afresh under it
        (before the broadcast, so before any worker reports); every worker names the run in
        its reports, and starts from rank 0's model."""
        run = self._run_id()
        self._all_workers = self.comm.workers  # the run's, however many go on
        if self.comm.rank == 0:
            self.comm.state_client.init(self.comm.workers, self.options.epsilon, run=run)
        self.comm.state_client.run = run
        self.broadcast_model()
        self._global = flatten(self.parameters()).clone()
        stats = bn_statistics(self.model)
        self._global_stats = pack(stats).clone() if stats else None

    def _run_id(self) -> str:
        """Rank 0's random id of this run, known to every worker (not from torch's generator:
        the run's seeded streams stay as they were)."""
        ident = self.comm.broadcast(torch.tensor([secrets.randbits(62)
                                                  if self.comm.rank == 0 else 0]))
        return f"{int(ident):016x}"

    @classmethod
    def goes_on_without_a_worker(cls, options: ESyncOptions) -> bool:
        # In the background the main thread waits only on its channel, which can be told
        # to give up; as published (blocking) it sits in gloo until the timeout.
        return bool(options.overlap)

    def rejoin(self) -> None:
        """After a regroup: the sum in flight is dropped, with the local steps since the
        last one applied; rank 0's global weights, BatchNorm statistics, outer momentum and
        round become everyone's (one broadcast), and each worker starts its next round from
        them; rank 0 starts the state server's run afresh without the lost ranks."""
        self._pending = self._sent = self._plan = self._answer = self._deadline = None
        self.local_steps = 0
        client = self.comm.state_client
        client.close()  # an answer of the old run may be unread on its connection
        lost = sorted(set(range(self._all_workers)) - set(self.comm.members()))
        client.run = f"{client.run.split('/')[0]}/{len(lost)}" if client.run else None
        client.lost = lost  # named in every report, for a restarted server
        if self.comm.rank == 0:
            client.init(self._all_workers, self.options.epsilon, run=client.run, lost=lost)
        stats = self._global_stats if self._global_stats is not None else torch.zeros(0)
        buffer = self.outer.buffer if self.outer.buffer is not None else torch.zeros(0)
        sizes = [self._global.numel(), stats.numel(), buffer.numel()]
        sizes = self.comm.broadcast(torch.tensor(sizes + [self.round], dtype=torch.float64))
        state = self.comm.broadcast(
            torch.cat([self._global, stats.to(self._global), buffer.to(self._global)])
            if self.comm.rank == 0 else self._global.new_zeros(int(sum(sizes[:3]))))
        weights, stats, buffer = state.split([int(n) for n in sizes[:3]])
        self._global = weights.clone()
        self._global_stats = stats.clone() if stats.numel() else None
        self.outer.buffer = buffer.clone() if buffer.numel() else None
        self.round = int(sizes[3])
        self._load(self._global, self._global_stats)
        self.optimizer.state.clear()  # local momentum belongs to the dropped steps
        if self.variates is not None:
            self.variates.reset()

    def join(self) -> None:
        """No data left (hetsync.wrap): from now on report a negligible step time, so the
        rounds are planned around the workers still computing (a slow device that has
        finished no longer sets their length)."""
        super().join()
        self._recent = deque([1e-6], maxlen=self.WINDOW)
        self.step_time = 1e-6

    def poll(self) -> None:
        """Apply a sum that came in; at a round's first step, read the server's plan."""
        if self._pending is not None and self._pending.done():
            self.settle()
        if self._deadline is None and self._plan is not None:
            with self.comm.clock.phase("query"):  # only what the first step did not hide
                self._answer = self._plan()
            self._plan = None

    def decide(self, step: Step) -> Action:
        if self.joined:  # no data left (hetsync.wrap): one round per step, no local update
            return Action.AVERAGE_MODELS
        self._recent.append(step.duration)
        c = self.step_time = statistics.median(self._recent)
        if self._deadline is None:  # the round's first step
            answer, self._answer = self._answer, None
            if answer is None or answer.ready or answer.time_left is None:
                return Action.AVERAGE_MODELS  # warm-up, or the slowest: one step a round
            # `time_left` counts from the round's start: its first step's, on this clock.
            self._deadline = step.started + answer.time_left
            self._epsilon = answer.epsilon
            self._planned = answer.steps_left  # the report was made at k = 0
        if at_step_limit(self.local_steps + 1, self.options.max_local_steps):
            return Action.AVERAGE_MODELS
        # A planned step may overrun the round by the server's margin (it was planned: it
        # only ran slow); one beyond the plan (the steps ran fast) must fit in the time left.
        margin = self._epsilon if self.local_steps + 1 < self._planned else 0.0
        if would_overrun(c, self._deadline - step.ended, margin):
            return Action.AVERAGE_MODELS
        return Action.LOCAL

    def apply(self, action: Action) -> None:
        if not self.joined:
            if self.variates is not None:
                self.variates.correct(self.parameters(), self.lr)
            self.optimizer.step()
            self.local_steps += 1
        if action is Action.AVERAGE_MODELS:
            self._aggregate()

    def _aggregate(self) -> None:
        self.settle()  # the previous round's sum, if it is still in flight
        params, stats = self.parameters(), bn_statistics(self.model)
        local = flatten(params)
        sent_stats = pack(stats) if stats else torch.zeros(0)
        # The report for the next round leaves now; its answer is read after that round's
        # first step.
        self._plan = self.comm.state_client.report_async(
            self.comm.rank, self.round + 1, 0, max(self.step_time or 0.0, 1e-6),
            self.comm.device_name)
        self._sent = (local, sent_stats)
        # [stats, ḡ_i (SCAFFOLD), weighted delta, τ], then 1 if this worker took local steps
        # (one that has joined under hetsync.wrap sends its last steps, then zeros, and is
        # not counted)
        delta = local - self._global
        variate = (self.variates.contribution(delta) if self.variates is not None
                   else torch.zeros(0))
        buffer = with_count(torch.cat([sent_stats, variate, contribution(
            delta, self.local_steps, self.weighting)]), self.local_steps > 0)
        if self.options.overlap:
            self._pending = self.comm.start_all_reduce(buffer, f"esync round {self.round}")
        else:
            self._apply_sum(self.comm.all_reduce(buffer))
        self.round += 1
        self.local_steps, self._deadline = 0, None

    def settle(self) -> None:
        """Apply the sum in flight, waiting for it if need be (timed as `wait`: a worker
        blocks here only while a slower one has not sent its delta yet)."""
        if self._pending is None:
            return
        with self.comm.clock.phase("wait"):
            summed, self._pending = self._pending.result(), None
            self._apply_sum(summed)

    def _apply_sum(self, summed: torch.Tensor) -> None:
        """The outer step on the combined delta (ESync: w_global += global_lr · mean(Δ));
        w_local ← w_global + what was learnt since the send (nothing without `overlap`);
        BN statistics ← their mean, likewise."""
        (sent, sent_stats), self._sent = self._sent, None
        params, stats = self.parameters(), bn_statistics(self.model)
        m = sent_stats.numel()
        v = m + (sent.numel() if self.variates is not None else 0)
        count = self.contributors = int(round(float(summed[-1])))
        if count:  # (none: every worker has joined; nothing to apply)
            self.outer.step(self._global, *combine(summed[v:-1], count, self.weighting))
            if self.variates is not None:
                self.variates.update(summed[m:v], count)
            if stats:
                self._global_stats = summed[:m] / count
        unflatten_into(self._global + (flatten(params) - sent), params)
        if stats:
            unflatten_into(self._global_stats + (pack(stats) - sent_stats), stats)

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
        self.settle()
        super().finish()
        # The steps taken since the last send are in no average: keep the global model.
        self._load(self._global, self._global_stats)

    def describe(self) -> dict[str, Any]:
        return {"global_update": self.settings, "overlap": bool(self.options.overlap),
                "max_local_steps": self.options.max_local_steps}

    def state_dict(self) -> dict[str, Any]:
        """Round, the global weights and BatchNorm statistics, and the recent step times.
        A sum still in flight is not state: `settle` it first (the loop does at the end)."""
        if self._pending is not None:
            raise RuntimeError("ESync.state_dict(): a sum is in flight; call settle() first")
        return {"round": self.round, "global_weights": self._global.clone(),
                "global_bn_stats": (None if self._global_stats is None
                                    else self._global_stats.clone()),
                "recent_step_times": list(self._recent), "outer": self.outer.state_dict(),
                "variates": None if self.variates is None else self.variates.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self._global = state["global_weights"].clone()
        stats = state["global_bn_stats"]
        self._global_stats = None if stats is None else stats.clone()
        self._recent = deque((float(t) for t in state["recent_step_times"]),
                             maxlen=self.WINDOW)
        self.outer.load_state_dict(state["outer"])
        if self.variates is not None and state.get("variates") is not None:
            self.variates.load_state_dict(state["variates"])
        self.step_time = statistics.median(self._recent) if self._recent else None
        self.local_steps, self._deadline, self._plan, self._answer = 0, None, None, None


class ESyncOuter(ESync):
    """ESync whose global update is an outer Nesterov optimizer over the mean delta
    (`hetsync.algorithms.outer`): the default of `hetsync launch`."""

    name = "esync-outer"
    defaults = {"global_lr": 0.7, "outer_momentum": 0.9, "weighting": "uniform",
                "drift_correction": "none"}


register(ModeSpec("esync", ESync, "local steps until the state server says the slowest is "
                  "done; all-reduce Δ = w_local − w_global; w_global += gl·mean(Δ)",
                  options=ESyncOptions, state_server=True,
                  lr_note="local rate, global 1"))
register(ModeSpec("esync-outer", ESyncOuter, "as esync; the global update is an outer "
                  "Nesterov optimizer (lr 0.7, momentum 0.9) on the mean delta; on non-IID "
                  "data blocking rounds of at most 4 local steps",
                  options=ESyncOptions, state_server=True, lr_note="local rate, outer 0.7",
                  # measured (results/levers-drift.md): the background sum's extra steps
                  # and the fastest worker's 8 steps a round are what drift on label skew
                  non_iid_options={"overlap": False, "max_local_steps": 4}))
