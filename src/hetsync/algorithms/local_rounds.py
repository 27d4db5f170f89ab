"""Rounds of local steps whose weight deltas are combined and applied by an outer optimizer:
the state that ESync, `esync-outer` and DiLoCo are compositions of.

Per round, on every worker:

1. local steps of the worker's own optimizer (its state kept across rounds), until the round's
   length policy (`hetsync.algorithms.round_length`) or `max_local_steps` ends the round;
2. one all-reduce over the chosen collective of [BatchNorm statistics, SCAFFOLD's ḡ_i (with
   drift correction, `hetsync.algorithms.scaffold`), the delta Δ = w_local − w_global as the
   weighting asks (`hetsync.algorithms.outer.contribution`), τ_i, 1 if the worker took local
   steps] — blocking, with the training loop's four floats of agreement at its end (one
   collective a round: `ControlPath.WITH_SUM`), or (`overlap`) handed to the worker's
   background channel while the next round's steps run;
3. the outer optimizer (`hetsync.algorithms.outer`, a `torch.optim.SGD` on the pseudo-gradient
   −D) steps w_global on the combined delta D; BatchNorm statistics ← their mean;
4. w_local ← w_global + what was learnt since the send (nothing when blocking).

With overlap (Shen et al., "Faster Distributed Deep Net Training: Computation and
Communication Decoupled SGD", IJCAI 2019, as ESync's default here) a worker never idles for the
others' sum; the steps taken meanwhile start from its own model rather than the average (one
round of staleness at most), and one that finishes a round while the previous sum is still in
flight waits for it (timed as `wait`). Evaluation sees w_global (`global_model`), and the model
kept at the end is w_global: the steps since the last send are in no average.

Eager updates (`eager_updates`, with overlap; Kale, Douillard and Donchev, "Eager Updates For
Overlapped Communication and Computation in DiLoCo", 2025) apply each round's outer step at
its end, without waiting for the others: at the end of round t, on worker i,

a. the sum of round t−1 has come in (waited for if need be): D_{t−1}, less the part of it that
   was this worker's own and went in eagerly a round ago, E_{t−1};
b. E_t = this worker's own weighted delta of round t times the previous sum's scale (`combine`:
   1/P for ``uniform``), its estimate of what it adds to D_t;
c. one outer step on (D_{t−1} − E_{t−1}) + E_t, and round t+1 starts from w_global (as
   DiLoCo's rounds do), its send of round t in flight meanwhile.

Every round's D is applied once in all: this worker's part a round early, the others' a round
late. The workers' w_global differ by their own parts (and, through the outer momentum, what
those left in it); evaluation sees the leader's. Where hetsync departs from the paper: a sum
completed outside a round's end (a checkpoint, an admission, the end) is applied on its own,
D − E, as one more outer step; BatchNorm statistics are the previous round's mean (the
setup's after the first round); after a regroup every worker takes the leader's w_global,
its own part of the dropped round included.

A worker that has joined (`hetsync.wrap`, no data left) sends zeros and is not counted; the
mean is over the workers that took steps.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from hetsync.algorithms.base import (Action, Admits, ControlPath, Mode, Step, bn_statistics,
                                     flatten, pack, unflatten_into, with_count)
from hetsync.algorithms.outer import (combine, contribution, describe_outer, momentum_buffer,
                                      outer_optimizer, outer_step, set_momentum_buffer)
from hetsync.algorithms.round_length import RoundLength, reached
from hetsync.algorithms.scaffold import ControlVariates


def global_update(defaults: dict[str, Any], options: Any) -> dict[str, Any]:
    """The global update's settings: each option given (not None), else the mode's default."""
    return {k: default if getattr(options, k, None) is None else getattr(options, k)
            for k, default in defaults.items()}


@dataclass
class OverlapOptions:
    """Whether a round's sum overlaps the next round's steps, shared by the modes built on
    `LocalRounds` (each mode's own default where not given: `validate_overlap`)."""

    overlap: bool | None = field(default=None, metadata={
        "flags": ("--overlap",),
        "help": "sum the weight deltas in the background while the next round's steps run, "
                "the global update applied a round late (0/1) (default: 1 for esync; for "
                "esync-outer 1, 0 on a non-IID partition; 0 for diloco, as published)"})

    eager_updates: bool = field(default=False, metadata={
        "flags": ("--eager-updates",),
        "help": "with --overlap 1: apply each round's outer step at its end, this worker's "
                "own delta at once and the others' a round late (eager updates, Kale et al. "
                "2025) (default: 0)"})

    def validate_overlap(self, default: bool) -> None:
        """Not given: the mode's `default`."""
        from hetsync.options import invalid_option

        if self.overlap is None:
            self.overlap = default
        if self.eager_updates and not self.overlap:
            raise invalid_option(self, "eager_updates", "0, or --overlap 1 beside it (eager "
                                 "updates apply a round's outer step while its sum is in "
                                 "flight; this run's rounds are blocking)")


class LocalRounds(Admits, Mode):
    """The parts composed (see the module docstring). A mode built on it passes its round
    length, its global update's settings (global_lr, outer_momentum, weighting,
    drift_correction), whether the sums overlap the next round (its options' `overlap`),
    and a step limit; it reads eager updates from its options' `eager_updates`."""

    counts_contributors = True

    def __init__(self, model, optimizer, comm, options, *, length: RoundLength,
                 settings: dict[str, Any], overlap: bool = False, max_local_steps: int = 0):
        super().__init__(model, optimizer, comm, options)
        self.length, self.settings = length, settings
        self.overlap, self.max_local_steps = overlap, max_local_steps
        self.eager = bool(getattr(options, "eager_updates", False))
        self.weighting = settings["weighting"]
        self.variates = (ControlVariates() if settings["drift_correction"] == "scaffold"
                         else None)
        #: the round's local steps, and their batches in this worker's own (`batch_share`)
        self.local_steps, self.local_batches = 0, 0.0
        self._global: torch.Tensor | None = None   # w_global: the outer optimizer's parameter
        self._global_stats: torch.Tensor | None = None
        self.outer: torch.optim.Optimizer | None = None
        # the aggregation in flight (overlap): the sum's future, and what this worker sent
        self._pending = None
        self._sent: tuple[torch.Tensor, torch.Tensor] | None = None  # (w_local, BN stats)
        self._early: torch.Tensor | None = None  # eager: E, this worker's part of the sum
        self._scale: float | None = None  # the last sum's `combine` scale (E's estimate)

    @property
    def control(self) -> ControlPath:
        # blocking, the loop's agreement rides on the round's sum: one collective a round
        return ControlPath.BACKGROUND if self.overlap else ControlPath.WITH_SUM

    def setup(self) -> None:
        """Every worker starts from rank 0's model; the outer optimizer holds w_global."""
        self.broadcast_model()
        self.setup_global()

    def setup_global(self) -> None:
        """w_global and the global BatchNorm statistics ← the model's own."""
        self._hold(flatten(self.parameters()))
        stats = bn_statistics(self.model)
        self._global_stats = pack(stats).clone() if stats else None

    def _hold(self, weights: torch.Tensor) -> None:
        """w_global ← a copy of `weights`, and an outer optimizer over it at this run's
        settings."""
        self._global = weights.detach().clone().to(self.parameters()[0].device)
        self.outer = outer_optimizer(self._global, self.settings["global_lr"],
                                     self.settings["outer_momentum"])

    def poll(self) -> None:
        """Apply a sum that came in (eager: at the round's end, with the round's own part)."""
        if not self.eager and self._pending is not None and self._pending.done():
            self.settle()

    def decide(self, step: Step) -> Action:
        if self.joined:  # no data left (hetsync.wrap): one round per step, no local update
            return Action.AVERAGE_MODELS
        steps = self.local_steps + 1
        if self.length.ends_round(step, steps) or reached(steps, self.max_local_steps):
            return Action.AVERAGE_MODELS
        return Action.LOCAL

    def apply(self, action: Action) -> None:
        if not self.joined:
            if self.variates is not None:
                self.variates.correct(self.parameters(), self.lr)
            self.optimizer.step()
            self.local_steps += 1
            self.local_batches += self.batch_share
        if action is Action.AVERAGE_MODELS:
            self._aggregate()

    def _aggregate(self) -> None:
        if self.eager:  # the previous round's sum, applied below with this round's own part
            with self.comm.clock.phase("wait"):
                summed = self._receive()
        else:
            self.settle()  # the previous round's sum, if it is still in flight
        local, sent_stats = self._sent = self._held()
        self.length.round_over(self.round + 1)
        # [stats, ḡ_i (SCAFFOLD), weighted delta, τ], then 1 if this worker took local steps
        # (one that has joined under hetsync.wrap sends its last steps, then zeros, and is
        # not counted)
        delta = local - self._global
        variate = (self.variates.contribution(delta) if self.variates is not None
                   else local.new_zeros(0))
        weighted = contribution(delta, self.local_steps, self.weighting,
                                self.local_batches * self.comm.sample_weight)
        buffer = with_count(torch.cat([sent_stats, variate, weighted]), self.local_steps > 0)
        if self.overlap:
            self._pending = self.comm.start_all_reduce(buffer, f"{self.name} round {self.round}")
        else:
            self._apply_sum(self.sum_with_proposal(buffer), self._take_sent())
        if self.eager:  # (the steps until the sum comes in count from where this leaves)
            self._apply_sum(summed, self._sent, own=weighted if self.local_steps else None)
            self._sent = self._held()
        self.local_steps, self.local_batches = 0, 0.0

    def _held(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_local, its BatchNorm statistics: empty without any), as copies."""
        stats = bn_statistics(self.model)
        local = flatten(self.parameters())
        return local, pack(stats) if stats else local.new_zeros(0)

    def _receive(self) -> torch.Tensor | None:
        """The sum in flight, waited for (None: there is none)."""
        if self._pending is None:
            return None
        summed, self._pending = self._pending.result(), None
        return summed

    def _take_sent(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What was sent with the sum in flight, given up as it is applied."""
        sent, self._sent = self._sent, None
        return sent

    def settle(self) -> None:
        """Apply the sum in flight, waiting for it if need be (timed as `wait`: a worker
        blocks here only while a slower one has not sent its delta yet)."""
        if self._pending is None:
            return
        with self.comm.clock.phase("wait"):
            self._apply_sum(self._receive(), self._take_sent())

    def _apply_sum(self, summed: torch.Tensor | None, sent: tuple[torch.Tensor, torch.Tensor],
                   own: torch.Tensor | None = None) -> None:
        """Steps 3 and 4 of the module docstring, `sent` the (w_local, BN statistics) the
        steps since are counted from. Eager (`own`: this worker's weighted delta and τ of the
        round it has just sent): steps a to c."""
        sent, sent_stats = sent
        params, stats = self.parameters(), bn_statistics(self.model)
        update = None
        if summed is not None:
            m = sent_stats.numel()
            v = m + (sent.numel() if self.variates is not None else 0)
            count = self.contributors = int(round(float(summed[-1])))
            if count:  # (none: every worker has joined; nothing to apply)
                vector, self._scale = combine(summed[v:-1], count, self.weighting)
                update = vector * self._scale
                if self._early is not None:  # (eager: it went in a round ago)
                    update -= self._early
                if self.variates is not None:
                    self.variates.update(summed[m:v], count)
                if stats:
                    self._global_stats = summed[:m] / count
        self._early = None
        if own is not None:  # (no sum yet: the scale as if every worker sent as this one)
            workers = self.comm.workers
            scale = (self._scale if self._scale is not None
                     else combine(own[-1:] * workers, workers, self.weighting)[1])
            self._early = own[:-1] * scale
            update = self._early if update is None else update + self._early
        if update is not None:
            outer_step(self.outer, update)
        unflatten_into(self._global + (flatten(params) - sent), params)
        if stats:
            unflatten_into(self._global_stats + (pack(stats) - sent_stats), stats)

    def rejoin(self) -> None:
        """After a regroup: the sum in flight is dropped, with the local steps since the
        last one applied; the leader's global weights, BatchNorm statistics, outer momentum
        and round become everyone's (one broadcast), and each worker starts its next round from
        them."""
        self._pending = self._sent = self._early = None
        self.local_steps, self.local_batches = 0, 0.0
        self._take_leaders_global()
        self._load(self._global, self._global_stats)
        self.optimizer.state.clear()  # local momentum belongs to the dropped steps
        if self.variates is not None:
            self.variates.reset()

    @classmethod
    def goes_on_without_a_worker(cls, options: Any) -> bool:
        # In the background the main thread waits only on its channel, which can be told
        # to give up. Blocking rounds would go on as `sync` does (tried: a lost worker's
        # regroup and admission worked), but the chaos bench lost a blocking DiLoCo run to
        # every worker lost within one admission before its first complete checkpoint
        # (results/chaos.md): they stop and resume instead.
        return bool(getattr(options, "overlap", False))

    def admit(self, joined: bool) -> None:
        """A worker joins (`Mode.admit`): every member holds the same global state once its
        sum is settled, and keeps its local steps since; the one that joins takes the
        leader's global state and starts its first round from it."""
        if joined:  # (no `setup`: its shapes; the values come from the leader)
            self.setup_global()
        # a member's steps since its w_global (with eager updates each member's is its own)
        local, stats = self._held()
        since = (local - self._global,
                 None if self._global_stats is None else stats - self._global_stats)
        self._take_leaders_global()
        if joined:
            self._load(self._global, self._global_stats)
        else:
            self._load(self._global + since[0], None if since[1] is None
                       else self._global_stats + since[1])

    def _take_leaders_global(self) -> None:
        """The leader's global weights, BatchNorm statistics, outer momentum and round, on
        every member (one broadcast of the sizes, then the values in checked chunks)."""
        stats = self._global_stats if self._global_stats is not None else torch.zeros(0)
        buffer = momentum_buffer(self.outer)
        buffer = buffer if buffer is not None else torch.zeros(0)
        sizes = [self._global.numel(), stats.numel(), buffer.numel()]
        sizes = self.comm.broadcast(torch.tensor(sizes + [self.round], dtype=torch.float64))
        state = self.comm.broadcast_state(
            torch.cat([self._global, stats.to(self._global), buffer.to(self._global)])
            if self.comm.leads else self._global.new_zeros(int(sum(sizes[:3]))))
        weights, stats, buffer = state.split([int(n) for n in sizes[:3]])
        self._global.copy_(weights)
        self._global_stats = stats.clone() if stats.numel() else None
        set_momentum_buffer(self.outer, buffer if buffer.numel() else None)
        self.round = int(sizes[3])

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
        self.settle()
        super().finish()
        # The steps taken since the last send are in no average: keep the global model.
        self._load(self._global, self._global_stats)

    def describe(self) -> dict[str, Any]:
        return {"global_update": self.settings, "outer": describe_outer(self.outer),
                "overlap": self.overlap, "eager_updates": self.eager,
                "max_local_steps": self.max_local_steps}

    def state_dict(self) -> dict[str, Any]:
        """Round, the global weights and BatchNorm statistics, the outer optimizer, the
        round length's state, the control variates. A sum still in flight is not state:
        `settle` it first (the loop does at the end)."""
        if self._pending is not None:
            raise RuntimeError(f"{type(self).__name__}.state_dict(): a sum is in flight; call "
                               f"settle() first")
        return {"round": self.round, "global_weights": self._global.clone(),
                "global_bn_stats": (None if self._global_stats is None
                                    else self._global_stats.clone()),
                "outer": self.outer.state_dict(), "length": self.length.state_dict(),
                "variates": None if self.variates is None else self.variates.state_dict()}

    def restart_state(self, peer: dict[str, Any]) -> dict[str, Any]:
        """The peer's round, global weights and outer optimizer (the same on every worker);
        this worker's own round-length state (its step times) and control variates, fresh."""
        return {**peer, "length": self.length.state_dict(), "variates": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self._hold(state["global_weights"])
        stats = state["global_bn_stats"]
        self._global_stats = None if stats is None else stats.clone()
        self.outer.load_state_dict(state["outer"])
        for group in self.outer.param_groups:  # this run's rate, not the checkpoint's
            group.update(lr=self.settings["global_lr"], momentum=self.settings["outer_momentum"],
                         nesterov=self.settings["outer_momentum"] > 0)
        self.length.load_state_dict(state["length"])
        if self.variates is not None and state.get("variates") is not None:
            self.variates.load_state_dict(state["variates"])
        self.local_steps, self.local_batches = 0, 0.0
        if self.eager:  # (each worker's w_global is its own: its rounds start from it)
            self._load(self._global, self._global_stats)
