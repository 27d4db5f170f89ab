"""`lookahead`: one device, an outer Nesterov step on its own pseudo-gradient every K steps —
SNOO (Kallusky et al. 2025, "SNOO: Step-K Nesterov Outer Optimizer"), which found that
DiLoCo's gain on one worker comes from this outer step alone: Lookahead (Zhang et al., NeurIPS
2019) with Nesterov momentum. A single-device recipe the bench measures the cluster against,
beside plain SGD (`local`) and SGD with Nesterov momentum (`local --momentum 0.9 --nesterov 1`).

Per round, on the one worker:

1. K steps of the local optimizer (SGD at the loop's rate) from the slow weights w;
2. D = w_fast − w, the negative of SNOO's pseudo-gradient;
3. the outer optimizer (`outer.outer_optimizer`, torch's SGD with DiLoCo's Nesterov: lr 0.7,
   μ 0.9, as `esync-outer` uses on the cluster) steps w on the pseudo-gradient −D;
4. the fast weights start again from w; the local optimizer keeps its state.

With μ = 0 this is Lookahead (k = K, α = lr); with K = 1, lr 1 and μ = 0, plain SGD.
BatchNorm statistics are the fast model's (one device: there is nothing to combine).
Evaluation, checkpoints and the model left at the end hold the slow weights w.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hetsync.algorithms.base import Action, Mode, Step, flatten, holding, unflatten_into
from hetsync.algorithms.outer import describe_outer, outer_optimizer, outer_step
from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.round_length import reached


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


class Lookahead(Mode):
    name = "lookahead"
    Options = LookaheadOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._steps = 0  # local steps since the last outer step

    def setup(self) -> None:
        self._hold(flatten(self.parameters()))

    def _hold(self, weights: torch.Tensor) -> None:
        """The slow weights ← a copy of `weights`, and an outer optimizer over them."""
        self._slow = weights.detach().clone().to(next(self.model.parameters()).device)
        self._outer = outer_optimizer(self._slow, self.options.lookahead_lr,
                                      self.options.lookahead_momentum)

    def decide(self, step: Step) -> Action:
        last = reached(self._steps + 1, self.options.lookahead_steps)
        return Action.LOCAL_ROUND if last else Action.LOCAL

    def apply(self, action: Action) -> None:
        self.optimizer.step()
        self._steps += 1
        if action is Action.LOCAL_ROUND:
            with torch.no_grad():
                params = self.parameters()
                outer_step(self._outer, flatten(params) - self._slow)
                unflatten_into(self._slow, params)
            self._steps = 0

    def global_model(self):
        """Hold the slow weights meanwhile."""
        return holding(self.parameters(), self._slow)

    def finish(self) -> None:
        unflatten_into(self._slow, self.parameters())  # the steps since the last outer one
        super().finish()                               # are in no outer step

    def describe(self) -> dict[str, Any]:
        return {"outer": f"{describe_outer(self._outer)} every "
                         f"{self.options.lookahead_steps} steps"}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "slow": self._slow.clone(),
                "outer": self._outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._hold(state["slow"])
        self._steps = 0  # a resumed worker starts from the slow weights: a round of its own
        self._outer.load_state_dict(state["outer"])


register(ModeSpec("lookahead", Lookahead, "one device: outer Nesterov on its own pseudo-gradient "
                  "every K steps (SNOO; Lookahead with momentum)", options=LookaheadOptions,
                  collective=False, max_workers=1))
