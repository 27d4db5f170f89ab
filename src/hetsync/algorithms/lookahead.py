"""`lookahead` and `sync-lookahead`: an outer Nesterov step on the model's own pseudo-gradient
every K steps — SNOO (Kallusky et al. 2025, "SNOO: Step-K Nesterov Outer Optimizer"), which
found that DiLoCo's gain on one worker comes from this outer step alone: Lookahead (Zhang et
al., NeurIPS 2019) with Nesterov momentum. `lookahead` is the single-device recipe the bench
measures the cluster against, beside plain SGD (`local`) and SGD with Nesterov momentum
(`local --momentum 0.9 --nesterov 1`); `sync-lookahead` is the same recipe on a synchronous
cluster, its inner steps `sync`'s (SNOO's outer step wraps any inner optimizer, a data-parallel
one included).

Per round, on every worker:

1. K steps from the slow weights w: of the local optimizer at the loop's rate (`lookahead`),
   or of `sync`, the mean gradient of all workers each (`sync-lookahead`);
2. D = w_fast − w, the negative of SNOO's pseudo-gradient;
3. the outer optimizer (`outer.outer_optimizer`, torch's SGD with DiLoCo's Nesterov: lr 0.7,
   μ 0.9, as `esync-outer` uses on the cluster) steps w on the pseudo-gradient −D;
4. the fast weights start again from w; the local optimizer keeps its state.

With μ = 0 this is Lookahead (k = K, α = lr); with K = 1, lr 1 and μ = 0, plain SGD (`sync`).
Under `sync-lookahead` every worker holds the same fast weights after each step, so each
takes the same outer step on its own: the outer step costs no communication. BatchNorm
statistics are the fast model's (`sync` averages them every step). Evaluation, checkpoints and
the model left at the end hold the slow weights w.

Where hetsync departs from SNOO: after a regroup or a join (`sync`'s), every member starts an
outer round afresh from the leader's model, its outer momentum dropped — the same on every
member, so the replicas stay identical without sending w and the momentum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.base import Action, Mode, Step, flatten, holding, unflatten_into
from hetsync.algorithms.outer import describe_outer, outer_optimizer, outer_step
from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.round_length import reached
from hetsync.algorithms.sync import SynchronousSGD, sum_length


@dataclass
class LookaheadOptions:
    """SNOO's own options."""

    lookahead_steps: int = field(default=8, metadata={
        "flags": ("--lookahead-steps",),
        "help": "K: local steps between outer steps (default: 8, the fastest device's steps "
                "per round on the 1, 2, 4, 8 cluster)"})
    lookahead_lr: float = field(default=0.7, metadata={
        "flags": ("--lookahead-lr",), "help": "outer learning rate (default: 0.7, DiLoCo's)"})
    lookahead_momentum: float = field(default=0.9, metadata={
        "flags": ("--lookahead-momentum",),
        "help": "outer Nesterov momentum (default: 0.9, DiLoCo's; 0: Lookahead)"})

    def validate(self) -> None:
        from hetsync.options import invalid_option

        if not 1 <= self.lookahead_steps <= 1_000_000:
            raise invalid_option(self, "lookahead_steps", "an integer in 1..1000000")
        if not 0 < self.lookahead_lr <= 10:
            raise invalid_option(self, "lookahead_lr", "a number in (0, 10]")
        if not 0 <= self.lookahead_momentum < 1:
            raise invalid_option(self, "lookahead_momentum", "a number in [0, 1)")


class SlowWeights:
    """SNOO's state on one replica (steps 2-4 above): the slow weights w, the outer optimizer
    over them and the steps taken since w."""

    def __init__(self, weights: torch.Tensor, options: LookaheadOptions) -> None:
        """w ← a copy of `weights`, a fresh outer optimizer over it, no steps since."""
        self.options = options
        self.weights = weights.detach().clone()
        self.outer = outer_optimizer(self.weights, options.lookahead_lr,
                                     options.lookahead_momentum)
        self.steps = 0

    def due(self) -> bool:
        """Whether the coming step ends an outer round (the K-th step from w)."""
        return reached(self.steps + 1, self.options.lookahead_steps)

    def stepped(self, params: list[torch.Tensor]) -> None:
        """A step was taken on `params`; where it ended the round, the outer step on w, and
        `params` ← w."""
        if not self.due():
            self.steps += 1
            return
        with torch.no_grad():
            outer_step(self.outer, flatten(params) - self.weights)
            unflatten_into(self.weights, params)
        self.steps = 0


class _HoldsSlowWeights:
    """What both modes do with their `SlowWeights` (`_slow`) besides stepping them."""

    def _hold(self, weights: torch.Tensor | None = None) -> None:
        """The slow weights ← `weights` (None: the model's own), on the model's device."""
        weights = flatten(self.parameters()) if weights is None else weights
        self._slow = SlowWeights(weights.to(next(self.model.parameters()).device),
                                 self.options)

    def global_model(self):
        """Hold the slow weights meanwhile."""
        return holding(self.parameters(), self._slow.weights)

    def finish(self) -> None:
        unflatten_into(self._slow.weights, self.parameters())  # the steps since the last
        super().finish()                                       # outer one are in none

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "outer": f"{describe_outer(self._slow.outer)} every "
                                               f"{self.options.lookahead_steps} steps"}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "slow": self._slow.weights.clone(),
                "outer": self._slow.outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._hold(state["slow"])  # a resumed worker starts from the slow weights: a round
        self._slow.outer.load_state_dict(state["outer"])  # of its own


class Lookahead(_HoldsSlowWeights, Mode):
    name = "lookahead"
    Options = LookaheadOptions

    def setup(self) -> None:
        self._hold()

    def decide(self, step: Step) -> Action:
        return Action.LOCAL_ROUND if self._slow.due() else Action.LOCAL

    def apply(self, action: Action) -> None:
        self.optimizer.step()
        self._slow.stepped(self.parameters())


class SyncLookahead(_HoldsSlowWeights, SynchronousSGD):
    name = "sync-lookahead"
    Options = LookaheadOptions

    def setup(self) -> None:
        super().setup()  # every worker starts from worker 0's model, then holds it as w
        self._hold()

    def apply(self, action: Action) -> None:
        super().apply(action)
        if self.contributors:  # (none: every worker has joined, no step was taken)
            self._slow.stepped(self.parameters())

    def _take_leaders(self) -> None:
        """After a regroup or a join: the leader's model, and an outer round afresh from it
        (the module docstring's departure)."""
        super()._take_leaders()
        self._hold()


register(ModeSpec("lookahead", Lookahead, "one device: outer Nesterov on its own pseudo-gradient "
                  "every K steps (SNOO; Lookahead with momentum)", options=LookaheadOptions,
                  collective=False, max_workers=1))
register(ModeSpec("sync-lookahead", SyncLookahead, "sync's steps, and an outer Nesterov step on "
                  "their pseudo-gradient every K of them (SNOO on a synchronous cluster)",
                  options=LookaheadOptions, lr_scaling="workers", lr_note="x workers",
                  counts_samples=True, sum_length=sum_length))
