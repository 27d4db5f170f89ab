"""`dgs`: dual-way gradient sparsification (DGS: Yan et al., ICPP 2020; its code is
GradientServer) on the asynchronous parameter server.

Per step, on worker k (`hetsync.algorithms.sparse_ps` for the shared steps):

1. SAMomentum: u ← m·u + lr·(g + wd·w) (m = 0.7, as the published runs);
2. send s = u at the top ρ of each layer (ρ = 1 %·lr_t/lr_0: the density falls with the rate,
   as the published code's), divide the unsent coordinates of u by m;
3. the server (`DgsRule`) keeps the global model W, a snapshot S and, per worker, acc_k, what
   it has sent that worker since the snapshot: W ← W − s; the reply is e = the top 1 % of each
   layer of W − S − acc_k, and acc_k ← acc_k + e (dual-way sparsification);
4. every R = 150 updates applied (all workers together), S ← W, and each worker's next reply
   is S, dense, with acc_k ← 0;
5. the worker adds e to its model (or takes S): its model is always S + acc_k, and that is
   what an evaluation on rank 0 sees (W itself stays on the server).

Where hetsync departs from the published code: the resync period counts updates applied by
the server, and the density follows the worker's own rate; the code counts rank 1's steps and
relays rank 1's rate, which on a mixed-speed cluster ties both to whichever machine is rank 1.
A rate of 0 (a cosine schedule's end, which a step past the time budget reaches before the
stop is agreed) keeps one coordinate a layer, not none: the published code's density of 0
is an empty push its top-k cannot make.
A pull (a worker starting, or ending: its `finish` takes the server's weights) renews S first,
as a resync does, so that it gets W rather than a stale S.
"""

from __future__ import annotations

from typing import Any

import torch

from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.sparse_ps import SparseApplyRule, SparseAsyncSGD, SparseOptions, sparse
from hetsync.compression import Layout, TopK


class DgsRule(SparseApplyRule):
    """The DGS server (steps 3–4 of the module docstring)."""

    def __init__(self, weights: torch.Tensor, layout: Layout, density: float = 0.01,
                 resync: int = 150):
        super().__init__(weights, lr=1.0)
        if resync < 1:
            raise ValueError(f"resync must be >= 1, got {resync}")
        self.snapshot = self.weights.clone()
        self.density, self.resync = density, resync
        self.selector = TopK(layout)
        self.sent: dict[int, torch.Tensor] = {}   # acc_k
        self.stale: set[int] = set()              # workers whose next reply is S, dense

    def pull(self, worker: int) -> torch.Tensor:
        """A worker (re)joining, or ending (its `finish`), gets the weights as they are now:
        S is renewed (as at a periodic resync), and the others take it, dense, at their next
        reply."""
        if self.updates and not torch.equal(self.snapshot, self.weights):
            self.snapshot = self.weights.clone()
            self.stale = set(self.sent)
        return self._resync(worker)

    def _resync(self, worker: int) -> torch.Tensor:
        self.sent[worker] = torch.zeros_like(self.weights)
        self.stale.discard(worker)
        return self.snapshot

    def push(self, worker: int, update):
        if worker not in self.sent:
            raise ValueError(f"worker {worker} pushed before it pulled the model")
        self.apply(update)
        if self.updates % self.resync == 0:
            self.snapshot = self.weights.clone()
            self.stale = set(self.sent)
        if worker in self.stale:
            return self._resync(worker)
        difference = self.weights - self.snapshot - self.sent[worker]
        indices = self.selector.select(difference, self.density)
        reply = sparse(difference[indices], indices, difference.numel())
        self.sent[worker].index_add_(0, indices, reply.values)
        return reply

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "snapshot": self.snapshot.clone(),
                "sent": {w: t.clone() for w, t in self.sent.items()},
                "stale": sorted(self.stale), "density": self.density, "resync": self.resync}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.snapshot = state["snapshot"].clone()
        self.sent = {int(w): t.clone() for w, t in state["sent"].items()}
        self.stale = {int(w) for w in state["stale"]}
        self.density, self.resync = float(state["density"]), int(state["resync"])


#: the lowest density a push is made at (one coordinate a layer, by `layer_k`'s floor)
MIN_DENSITY = 1e-9


class DualWayGradientSparsification(SparseAsyncSGD):
    name = "dgs"
    memory_name = "samomentum"
    selector_name = "topk"
    default_density = 0.01
    default_momentum = 0.7

    def setup(self) -> None:
        self.initial_lr = self.lr
        super().setup()

    def density(self) -> float:
        # (> 0: a layer keeps at least one coordinate, `layer_k`, however low the rate falls)
        return min(1.0, max(self.base_density * self.lr / self.initial_lr, MIN_DENSITY))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "initial_lr": self.initial_lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.initial_lr = float(state["initial_lr"])


def server_rule(weights: torch.Tensor, lr: float, options: SparseOptions,
                layout: Layout, workers: int) -> DgsRule:
    density = options.density if options.density is not None else 0.01
    return DgsRule(weights, layout, density, options.resync)


register(ModeSpec("dgs", DualWayGradientSparsification, "dual-way gradient sparsification: "
                  "push the top 1 % per layer of SAMomentum; the parameter server answers the "
                  "top 1 % of what the worker lacks, dense every 150 updates",
                  options=SparseOptions, parameter_server=True, server_rule=server_rule,
                  lr_note="worker rate"))
