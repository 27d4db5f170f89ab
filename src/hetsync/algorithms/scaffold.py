"""Control variates against client drift, for a local-step mode (SCAFFOLD: Karimireddy et
al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020).

On non-IID data a worker's local steps follow its own shard's gradient, so its delta drifts
towards its own classes, the more the more steps it takes (a fast worker of ESync takes 8 for
the slowest's 1). SCAFFOLD corrects every local step by the difference between an estimate of
the global gradient, c, and of the worker's own, c_i:

1. each local step descends g_i(y) + c − c_i instead of g_i(y);
2. at the end of a round of local steps, the worker's mean gradient over the round, ḡ_i, is
   what its delta Δ_i says less the corrections it applied: ḡ_i = (−Δ_i − Σ_k η_k·(c − c_i)_k)
   / Σ_k η_k (option II of the paper);
3. ḡ_i travels in the round's all-reduce beside the delta; when the sum is in, c_i ← ḡ_i and
   c ← mean ḡ_i (so c = mean c_i, as in the paper).

Both start at zero, so the first round is plain local SGD. hetsync departs from the paper in
that the steps' rates are summed (a scheduled rate changes within a round) and that under
ESync's background aggregation the variates change when the sum arrives, a few steps into the
next round: step 2 subtracts the corrections each step actually applied, so ḡ_i stays exact.
The price is a second model-sized vector in every round's all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetsync.algorithms.base import unflatten_into

DRIFT_CORRECTIONS = ("none", "scaffold")


@dataclass
class ControlVariates:
    """c_i (`own`) and c (`common`) as flat vectors, and the bookkeeping of the round in
    progress: its rate sum, the corrections applied so far (`_applied`, with the rates since
    the correction last changed in `_rates`), and the ḡ_i sent but not yet summed."""

    own: torch.Tensor | None = None
    common: torch.Tensor | None = None
    rate_sum: float = 0.0
    _rates: float = 0.0
    _applied: torch.Tensor | None = None
    _sent: torch.Tensor | None = None
    _correction: list[torch.Tensor] | None = None  # c − c_i, shaped as the parameters

    def correct(self, params: list[torch.Tensor], lr: float) -> None:
        """Step 1: add c − c_i to the gradients about to be applied at rate `lr`."""
        self.rate_sum += lr
        if self.own is None:
            return
        self._rates += lr
        if self._correction is None:
            self._correction = [torch.empty_like(p) for p in params]
            unflatten_into(self.common - self.own, self._correction)
        for p, extra in zip(params, self._correction):
            if p.grad is not None:
                p.grad.add_(extra)

    def contribution(self, delta: torch.Tensor) -> torch.Tensor:
        """Step 2, when a round is sent: ḡ_i (kept until the sum comes in)."""
        self._fold()
        applied = self._applied if self._applied is not None else torch.zeros_like(delta)
        mean = ((-delta - applied) / self.rate_sum if self.rate_sum > 0
                else torch.zeros_like(delta))
        self.rate_sum, self._applied, self._sent = 0.0, None, mean
        return mean

    def update(self, summed: torch.Tensor, count: int) -> None:
        """Step 3, when the round's sum is in."""
        self._fold()  # the steps since the send applied the old correction
        self.own, self._sent = self._sent, None
        self.common, self._correction = summed / count, None

    def _fold(self) -> None:
        """Add the corrections applied since the last change to `_applied`."""
        if self._rates and self.own is not None:
            step = (self.common - self.own) * self._rates
            self._applied = step if self._applied is None else self._applied + step
        self._rates = 0.0

    def reset(self) -> None:
        """Back to zero (after a regroup: the lost worker's c_i leaves c = mean c_i false)."""
        self.own = self.common = self._applied = self._sent = self._correction = None
        self.rate_sum = self._rates = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"own": None if self.own is None else self.own.clone(),
                "common": None if self.common is None else self.common.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        if state["own"] is not None and state["common"] is not None:
            self.own, self.common = state["own"].clone(), state["common"].clone()
