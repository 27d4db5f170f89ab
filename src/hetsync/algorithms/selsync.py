"""`selsync`: SelSync's selective synchronisation (Tyagi & Swany, "Accelerating Distributed ML
Training via Selective Synchronization", CLUSTER'23).

Per step, on every worker:

1. forward and backward on the local batch;
2. n = the windowed EWMA of the sum of per-tensor gradient L2 norms (`windowed_ewma`: the last
   w values, weights (1 − a)^k with k = 1 for the newest, normalised; w = 25, a = 0.01);
3. D = |n − prev| / prev, prev ← n; D̄ = the windowed EWMA of D;
4. vote 1 if the window has not filled yet or D̄ ≥ δ (δ = 0.3) — `significance_vote`, pure;
5. sum the votes (one tiny all-reduce); if any worker voted, all aggregate: the parameters
   (default: average them, then apply the local gradient, as the published code does) or the
   gradients (their mean, then the step); else each applies its local update.

Where hetsync departs from the published code: the empty window does not divide by zero (the
first window always synchronises, and prev = 0 counts as a change); the vote and the
aggregation run over hetsync's collectives; `--selsync-aggregate gradients` is the paper's
gradient mode. Momentum buffers and BatchNorm statistics stay local, as in the paper. SelDP
(every worker draws from the whole data set in its own seeded order) is `--partition shared`;
data injection for non-IID partitions is `--inject 1` (`hetsync.data.injection`). The workers
hold different models between synchronisations: an evaluation sees their average (one
all-reduce, counted as evaluation; the local models are put back after it), and the run ends
with that average as its model, where the published code would keep each worker's own. The vote
blocks every step, so SelSync runs at the slowest worker's pace under compute heterogeneity:
it saves communication, never waiting.

A lost worker (`runtime/membership.py`; the paper does not say): the vote's sum fails on the
survivors connected to it, the others hear the regroup's alarm (`CommContext.hear`), they regroup and `rejoin` averages their models (one of them may have
averaged in the failed step and another not), then they go on, one drawing the lost worker's
shard in turn (`runtime/shards.py`). A worker that joins (`admit`) takes the members' mean.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from hetsync.algorithms.base import (Action, Admits, Mode, Step, bn_statistics, flatten, gradients,
                                     set_gradients, unflatten_into)
from hetsync.algorithms.registry import ModeSpec, register


def windowed_ewma(values: Iterable[float], a: float) -> float:
    """SelSync's E(·): the values (oldest first) weighted (1 − a)^k, k = 1 for the newest,
    normalised. 0 for no values."""
    values = list(values)
    weights = [(1 - a) ** k for k in range(len(values), 0, -1)]
    total = sum(weights)
    return sum(w * v for w, v in zip(weights, values)) / total if total else 0.0


def significance_vote(mean_change: float, steps: int, window: int, delta: float) -> bool:
    """Vote to synchronise: while the first window fills, or when the smoothed relative change
    of the gradient norm reaches δ."""
    return steps < window or mean_change >= delta


@dataclass
class SelSyncOptions:
    """SelSync's threshold, window and smoothing, and what it aggregates."""

    delta: float = field(default=0.3, metadata={
        "flags": ("--selsync-delta",), "help": "SelSync: synchronise when the smoothed "
                                               "relative change of the gradient norm is >= this"})
    window: int = field(default=25, metadata={
        "flags": ("--selsync-window",), "help": "SelSync: EWMA window w (steps)"})
    alpha: float = field(default=0.01, metadata={
        "flags": ("--selsync-alpha",), "help": "SelSync: EWMA smoothing a"})
    aggregate: str = field(default="parameters", metadata={
        "flags": ("--selsync-aggregate",), "help": "SelSync: what a synchronised step "
                                                   "averages: parameters or gradients"})

    def validate(self) -> "SelSyncOptions":
        from hetsync.options import invalid_option

        if not 0 <= self.delta < float("inf"):
            raise invalid_option(self, "delta", "a number >= 0")
        if self.window < 1:
            raise invalid_option(self, "window", "an integer >= 1")
        if not 0 <= self.alpha < 1:
            raise invalid_option(self, "alpha", "a number in [0, 1)")
        if self.aggregate not in ("parameters", "gradients"):
            raise invalid_option(self, "aggregate", "parameters or gradients")
        return self


class SelSync(Admits, Mode):
    name = "selsync"
    Options = SelSyncOptions
    collective_global_model = True
    counts_contributors = True

    def __init__(self, model, optimizer, comm, options: SelSyncOptions | None = None):
        super().__init__(model, optimizer, comm, options)
        self.options.validate()
        w = self.options.window
        self.steps = 0
        self.prev = 1.0
        self._norms: deque[float] = deque(maxlen=w)
        self._changes: deque[float] = deque(maxlen=w)
        self.synced = False   # whether the last step synchronised
        self._vote = False
        self.synced_steps = 0
        self._global: torch.Tensor | None = None  # the last round's global sum / P
        self._ended = False                        # `finish` averaged every model

    def setup(self) -> None:
        self.broadcast_model()

    def decide(self, step: Step) -> Action:
        """Update the significance statistics from this step's gradient (no I/O)."""
        if self.joined:  # no gradient of its own: it votes no (`apply`)
            return Action.VOTE
        norm = sum(float(g.norm()) for g in gradients(self.parameters()))
        self._norms.append(norm)
        n = windowed_ewma(self._norms, self.options.alpha)
        change = abs(n - self.prev) / self.prev if self.prev > 0 else float("inf")
        self.prev = n
        self._changes.append(change)
        self._vote = significance_vote(windowed_ewma(self._changes, self.options.alpha),
                                       self.steps, self.options.window, self.options.delta)
        return Action.VOTE

    def apply(self, action: Action) -> None:
        self._exchange(contributes=not self.joined)
        if not self.joined:
            self.optimizer.step()
        self.steps += 1
        self.synced_steps += self.synced

    def _exchange(self, contributes: bool, evaluates: bool = False,
                  phase: str = "comm") -> None:
        """One round of the workers' lockstep, as every worker takes part in it:

        1. Sum [votes, contributors, evaluators]. A worker that has joined (hetsync.wrap) or
           that evaluates this round votes no and is not counted in the mean.
        2. If any voted: average the contributors' parameters (or gradients); the others
           send zeros and take the mean.
        3. If any evaluates (`global_model`, also on a worker whose data has run out):
           every worker sends its model for the global model's sum (`_global`, which
           the evaluating worker holds in `global_model`).
        """
        votes = self.comm.barrier(torch.tensor([float(self._vote and contributes),
                                                float(contributes), float(evaluates)]),
                                  phase=phase)
        self.synced = bool(votes[0] > 0)
        count = int(votes[1])
        self.contributors = count + int(votes[2])  # (an evaluating worker has not finished)
        params = self.parameters()
        if self.synced and self.options.aggregate == "gradients":
            grads = flatten(gradients(params))
            summed = self._sum(grads if contributes else grads * 0, phase)
            set_gradients(summed / count, params)
        elif self.synced:  # average the parameters, then the local step (as the code does)
            local = flatten(params)
            summed = self._sum(local if contributes else local * 0, phase)
            unflatten_into(summed / count, params)
        if votes[2] > 0:  # (kept by the evaluator only: the others just take part)
            summed = self._sum(flatten(self._model_parts()), phase) / self.comm.workers
            self._global = summed if evaluates else None

    def _sum(self, buffer: torch.Tensor, phase: str) -> torch.Tensor:
        with self.comm.clock.phase(phase):
            return self.comm.sum_on_group(buffer)

    def _model_parts(self) -> list[torch.Tensor]:
        return self.parameters() + bn_statistics(self.model)

    @contextmanager
    def global_model(self) -> Iterator[None]:
        """Hold the workers' average (parameters and BatchNorm statistics) meanwhile. It is
        made in a round of the workers' lockstep (`_exchange`) in which this worker
        evaluates instead of stepping; the others take part from their step, or from
        `finish` once their data has run out. So one worker may evaluate alone, or each at
        its own step (uneven epochs). After `finish` every model is the average already. A
        departure from the paper's code, which evaluates outside training."""
        parts = self._model_parts()
        lockstep = self.comm.workers > 1 and not self._ended  # (after `finish`: all equal)
        if lockstep:  # timed as evaluation (the loop counts it so)
            self._exchange(contributes=False, evaluates=True, phase="eval")
        local = flatten(parts)  # (after the round's synchronisation, if any: it is kept)
        if lockstep:
            unflatten_into(self._global, parts)
            self._global = None
        try:
            yield
        finally:
            unflatten_into(local, parts)

    def finish(self) -> None:
        """End with one model, the workers' average: what `global_model` shows, so the model a
        user saves after `hetsync.wrap`'s `finish()` is the one evaluated (every worker is
        here, after the agreed stop)."""
        if self.comm.workers > 1:
            parts = self._model_parts()
            unflatten_into(self.comm.all_reduce(flatten(parts)) / self.comm.workers, parts)
        self._ended = True
        super().finish()

    def rejoin(self) -> None:
        """After a regroup: the survivors' mean model (a synchronisation, as if one had
        voted: a survivor may have averaged in the failed step and another not) and the
        leader's round."""
        self._take_members_mean(joined=False)

    def admit(self, joined: bool) -> None:
        """A worker joins at a round's end: every member, and the joiner (`joined`: it
        sends zeros and is not counted), holds the members' mean model and the leader's
        round. The joiner's window starts empty, so it votes to synchronise until its
        window has filled, and every worker synchronises with it meanwhile."""
        self._take_members_mean(joined)

    def _take_members_mean(self, joined: bool) -> None:
        parts = self._model_parts()
        mine = flatten(parts) * (0.0 if joined else 1.0)
        summed = self.comm.all_reduce(torch.cat([mine, mine.new_tensor([0.0 if joined
                                                                       else 1.0])]))
        unflatten_into(summed[:-1] / summed[-1], parts)
        self.round = int(self.comm.broadcast(
            torch.tensor([float(self.round)], dtype=torch.float64)).item())
        self.synced = True

    def round_record(self) -> dict[str, Any]:
        return {"synced": int(self.synced)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps": self.steps, "prev": self.prev,
                "norms": list(self._norms), "changes": list(self._changes),
                "synced_steps": self.synced_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.steps, self.prev = int(state["steps"]), float(state["prev"])
        self.synced_steps = int(state["synced_steps"])
        w = self.options.window
        self._norms = deque((float(x) for x in state["norms"]), maxlen=w)
        self._changes = deque((float(x) for x in state["changes"]), maxlen=w)


register(ModeSpec("selsync", SelSync, "every step a significance vote (relative change of the "
                  "gradient norm >= delta); if any votes, all average parameters (or "
                  "gradients), else local updates", options=SelSyncOptions,
                  lr_note="local rate"))
