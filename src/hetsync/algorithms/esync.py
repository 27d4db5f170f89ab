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

ESync as published (`overlap=False`) waits for every worker at step 3's all-reduce (which also
carries the training loop's agreement: `ControlPath.WITH_SUM`; the wait is timed inside it, as
`comm`) and continues from w_global. hetsync's
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

ESync is a composition (`hetsync.algorithms.local_rounds`): its own part is the round length,
`StatePlan` (steps 1 and 2); the sums, their overlap, the outer optimizer over a weighting of
the deltas (`hetsync.algorithms.outer`) and `--drift-correction scaffold`'s control variates
(`hetsync.algorithms.scaffold`; with blocking rounds only) are the shared parts.

Unlike the original, no batch is drawn and thrown away when the worker is told to stop: the
decision is made after a step, not before the next one; and a state server that cannot be
reached does not stop the workers: their rounds follow its last plan until it answers
(`StatePlan`). The local optimizer's momentum (0 by
default, as in ESync) stays local. A step's time is its data, forward, backward and emulated
slowdown; the local update that follows it (a small fraction of a step) is not in it.
"""

from __future__ import annotations

import secrets
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hetsync.algorithms.base import Step
from hetsync.algorithms.local_rounds import LocalRounds, OverlapOptions, global_update
from hetsync.algorithms.outer import OuterOptions, WeightingOptions
from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.round_length import StepTimes
from hetsync.algorithms.scaffold import DRIFT_CORRECTIONS
from hetsync.state.policy import Decision, would_overrun
from hetsync.state.service import STATE_SERVER


@dataclass
class ESyncOptions(OverlapOptions, WeightingOptions, OuterOptions):
    """ESync's own options (and the outer step's, `-gl --outer-momentum`, how the deltas
    combine, `--weighting`, and whether the sums overlap, `--overlap`: by default they do,
    where ESync as published waits for them)."""

    local_lr: float | None = field(default=None, metadata={
        "flags": ("-ll", "--local-lr"), "help": "ESync local learning rate (default: -l)"})
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
    max_local_steps: int = field(default=0, metadata={
        "flags": ("--max-local-steps",),
        "help": "end a worker's round after at most N local steps; a faster worker then "
                "waits for the slowest's sum (with --overlap 1: after its next round's steps): "
                "less client drift on non-IID data, less throughput (0: no limit) (default: "
                "0; esync-outer on a non-IID partition: 4)"})

    def validate(self) -> "ESyncOptions":
        from hetsync.options import invalid_option

        self.validate_outer()
        self.validate_weighting()
        self.validate_overlap(True)
        if self.local_lr is not None and not (0 < self.local_lr < float("inf")):
            raise invalid_option(self, "local_lr", "a finite number > 0")
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


class StatePlan:
    """ESync's round length (steps 1 and 2 of the module docstring): report the step time c
    when a round is over, read the state server's plan after the next round's first step
    (`poll`), then end the round when one more step would overrun the slowest's time.

    A server that cannot be reached (it died; `launch` is starting it again; or it was a
    thread of a lost rank 0 under `hetsync.wrap`) does not stop the worker: its rounds follow
    the last plan it gave, and it tries the server again after a pause that doubles from
    `RETRY_S` to `MAX_RETRY_S` (a round's read waits at most `READ_S` for it)."""

    READ_S, RETRY_S, MAX_RETRY_S = 0.25, 1.0, 10.0

    def __init__(self, comm) -> None:
        self.comm = comm
        #: on a virtual clock (`hetsync.clock`) the server holds a round's reports until all
        #: are in and the plan is waited for, so that it does not depend on the real order of
        #: the requests: the seconds it may hold them (0: the wall clock, answered at once)
        self.hold = comm.timeout if comm.clock.source.virtual else 0.0
        self.step_time: float | None = None
        self._times = StepTimes()
        self._deadline: float | None = None  # local clock: when the round should end
        self._planned = 0  # the steps the server planned for this round
        self._epsilon = 0.0
        self._plan: Callable[[], Decision] | None = None  # reads the server's answer
        self._answer: Decision | None = None  # read by `poll`, used by `ends_round`
        self._last: Decision | None = None    # the server's last plan
        self._retry_at: float | None = None   # unreachable: when to try it again
        self._pause = 0.0

    def poll(self) -> None:
        """At a round's first step, read the server's plan (one query per round, off the
        critical path: only what the first step did not hide is timed as `query`)."""
        if self._deadline is None and self._plan is not None:
            with self.comm.clock.phase("query"):
                self._answer = self._read(self._plan)
            self._plan = None

    def _read(self, plan: Callable[[], Decision]) -> Decision | None:
        """The server's answer, or where it cannot be reached its last plan (and a pause
        before the next try)."""
        from hetsync.state.client import StateServerUnreachable

        try:
            answer = plan()
        except StateServerUnreachable as err:  # (a refusal, e.g. of another run, stands)
            self.unreachable(err)
            return self._last
        self._retry_at, self._pause, self._last = None, 0.0, answer
        return answer

    def unreachable(self, err: Exception) -> None:
        """The server did not answer: say so (once an outage), and pause before trying it
        again."""
        if self._retry_at is None:
            client, cause = self.comm.service, err.__cause__ or err
            warnings.warn(f"rank {self.comm.rank}: the state server at {client.host}:"
                          f"{client.port} did not answer ({type(cause).__name__}); the rounds "
                          f"follow its last plan until it answers again", RuntimeWarning,
                          stacklevel=3)
        self._pause = min(2 * self._pause, self.MAX_RETRY_S) or self.RETRY_S
        self._retry_at = time.monotonic() + self._pause

    def ends_round(self, step: Step, steps: int) -> bool:
        c = self.step_time = self._times.add(step.duration)
        if self._deadline is None:  # the round's first step
            answer, self._answer = self._answer, None
            if answer is None or answer.ready or answer.time_left is None:
                return True  # warm-up, or the slowest: one step a round
            # `time_left` counts from the round's start: its first step's, on this clock.
            self._deadline = step.started + answer.time_left
            self._epsilon = answer.epsilon
            self._planned = answer.steps_left  # the report was made at k = 0
        # A planned step may overrun the round by the server's margin (it was planned: it
        # only ran slow); one beyond the plan (the steps ran fast) must fit in the time left.
        margin = self._epsilon if steps < self._planned else 0.0
        return would_overrun(c, self._deadline - step.ended, margin)

    def round_over(self, next_round: int) -> None:
        """Report for the next round now; its answer is read after that round's first step
        (while the server cannot be reached, until its pause is over: the last plan)."""
        self._deadline = None
        if self._retry_at is not None and time.monotonic() < self._retry_at:
            self._answer = self._last
            return
        self._plan = self.comm.service.report_async(
            self.comm.rank, next_round, 0, max(self.step_time or 0.0, 1e-6),
            # (before its first plan, or held, as long as the client tries: it may be
            # starting, or waiting for a slower worker's report)
            self.comm.device_name,
            retry_s=None if self._last is None or self.hold else self.READ_S)

    def forget(self) -> None:
        """Drop the round in progress and the report in flight (a regroup, the end)."""
        self._plan = self._answer = self._deadline = None

    def joined(self) -> None:
        """No data left (hetsync.wrap): from now on report a negligible step time, so the
        rounds are planned around the workers still computing."""
        self._times = StepTimes([1e-6])
        self.step_time = 1e-6

    def state_dict(self) -> dict[str, Any]:
        return {"recent_step_times": self._times.as_list()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._times = StepTimes(state["recent_step_times"])
        self.step_time = self._times.median
        self.forget()


class ESync(LocalRounds):
    name = "esync"
    Options = ESyncOptions
    aggregation_pass = True
    #: the global update's defaults (ESync as published: the mean delta, applied at rate 1)
    defaults = {"global_lr": 1.0, "outer_momentum": 0.0, "weighting": "uniform",
                "drift_correction": "none"}

    def __init__(self, model, optimizer, comm, options: ESyncOptions | None = None):
        if comm.service is None:
            raise ValueError(f"mode {self.name!r} needs a state server client (-ip/-port)")
        options = (options or ESyncOptions()).validate()
        super().__init__(model, optimizer, comm, options, length=StatePlan(comm),
                         settings=global_update(self.defaults, options),
                         overlap=bool(options.overlap),
                         max_local_steps=options.max_local_steps)
        self._all_workers = comm.run_workers or comm.workers  # the run's, however many go on
        self._run_base = 0  # the run's id (`_take_run_id`)

    @classmethod
    def optimizer_lr(cls, base_lr: float, options: ESyncOptions) -> float:
        return base_lr if options.local_lr is None else options.local_lr

    @property
    def step_time(self) -> float | None:
        return self.length.step_time

    def setup(self) -> None:
        """Rank 0 draws the run's id and starts the state server's run afresh under it
        (before the broadcast, so before any worker reports), without the spares that have
        not joined; every worker names the run in its reports, and starts from rank 0's
        model."""
        self._take_run_id()
        client = self.comm.service
        client.lost = self._absent()
        if self.comm.rank == 0:
            client.init(self._all_workers, self.options.epsilon, run=client.run,
                        lost=client.lost, hold=self.length.hold)
        super().setup()

    def _absent(self) -> list[int]:
        """The run's ranks that take no part now: lost, or spares that have not joined."""
        return sorted(set(range(self._all_workers)) - set(self.comm.members()))

    def _take_run_id(self) -> None:
        """Rank 0's (the leader's) random id of this run, known to every worker (not from
        torch's generator: the run's seeded streams stay as they were)."""
        self._run_base = int(self.comm.broadcast(torch.tensor(
            [secrets.randbits(62) if self.comm.leads else 0])))
        self.comm.service.run = f"{self._run_base:016x}"

    def rejoin(self) -> None:
        """After a regroup (see `LocalRounds.rejoin`), the leader also starts the state
        server's run afresh without the lost ranks."""
        self._new_plan()
        super().rejoin()

    def admit(self, joined: bool) -> None:
        """A worker joins (see `LocalRounds.admit`); the leader starts the state server's run
        afresh with it, so that its rounds are planned for from the next one."""
        self._take_run_id()  # (the joiner has none yet)
        self._new_plan()
        super().admit(joined)

    def _new_plan(self) -> None:
        """The members changed: the round in progress is planned no more, and the leader
        starts the state server's run afresh for them, under the run's id and the
        generation (every report names the lost ranks too, for a restarted server)."""
        self.length.forget()
        client = self.comm.service
        client.close()  # an answer of the old run may be unread on its connection
        lost = self._absent()
        client.run = f"{self._run_base:016x}/{self.comm.generation}"
        client.lost = lost
        if self.comm.leads:
            from hetsync.state.client import StateServerUnreachable

            try:  # (a server that is back takes the run from the reports, which name it)
                client.init(self._all_workers, self.options.epsilon, run=client.run,
                            lost=lost, retry_s=StatePlan.READ_S, hold=self.length.hold)
            except StateServerUnreachable as err:
                self.length.unreachable(err)

    def join(self) -> None:
        """No data left (hetsync.wrap): the rounds are planned around the workers still
        computing (a slow device that has finished no longer sets their length)."""
        super().join()
        self.length.joined()

    def poll(self) -> None:
        """Apply a sum that came in; at a round's first step, read the server's plan."""
        super().poll()
        self.length.poll()

    def finish(self) -> None:
        self.length.forget()  # a report of a round that will not run: its answer is not read
        super().finish()


class ESyncOuter(ESync):
    """ESync whose global update is an outer Nesterov optimizer over the mean delta
    (`hetsync.algorithms.outer`): the default of `hetsync launch`."""

    name = "esync-outer"
    defaults = {"global_lr": 0.7, "outer_momentum": 0.9, "weighting": "uniform",
                "drift_correction": "none"}


def sum_length(model_numel: int, stats_numel: int, options: ESyncOptions) -> int:
    """A round's sum: [stats, ḡ_i with SCAFFOLD, Δ, τ, contributors]."""
    variates = model_numel if options.drift_correction == "scaffold" else 0
    return stats_numel + variates + model_numel + 2


register(ModeSpec("esync", ESync, "local steps until the state server says the slowest is "
                  "done; all-reduce Δ = w_local − w_global; w_global += gl·mean(Δ)",
                  options=ESyncOptions, service=STATE_SERVER, sum_length=sum_length,
                  lr_note="local rate, global {global_lr:g}", counts_samples=True,
                  defaults=ESync.defaults))
register(ModeSpec("esync-outer", ESyncOuter, "as esync; the global update is an outer "
                  "Nesterov optimizer (lr {global_lr:g}, momentum {outer_momentum:g}) on the "
                  "mean delta; on non-IID data blocking rounds of at most 4 local steps",
                  options=ESyncOptions, service=STATE_SERVER, sum_length=sum_length,
                  lr_note="local rate, outer {global_lr:g}", counts_samples=True,
                  defaults=ESyncOuter.defaults,
                  # measured (results/levers-drift.md): the background sum's extra steps
                  # and the fastest worker's 8 steps a round are what drift on label skew
                  non_iid_options={"overlap": False, "max_local_steps": 4}))
