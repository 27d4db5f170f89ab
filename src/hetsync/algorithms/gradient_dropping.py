"""`gd`: gradient dropping (Aji & Heafield, "Sparse Communication for Distributed Gradient
Descent", EMNLP 2017) on the asynchronous parameter server, as DGS's code runs this baseline.

Per step, on every worker (`hetsync.algorithms.sparse_ps` for the shared steps):

1. v ← v + lr·(g + wd·w) (`ResidualMemory`; no momentum);
2. send the top ρ = 1 % of each layer of v (exact top-k), zero v there;
3. the server applies W ← W − s and answers the dense W, which replaces the worker's model.

Where hetsync departs from the paper: the paper drops by a global threshold and sums on a
synchronous server; here the selection is per layer and the server asynchronous, as in DGS's
comparison.
"""

from __future__ import annotations

from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.sparse_ps import SparseApplyRule, SparseAsyncSGD, SparseOptions


class GradientDropping(SparseAsyncSGD):
    name = "gd"
    memory_name = "residual"
    selector_name = "topk"
    default_density = 0.01


register(ModeSpec("gd", GradientDropping, "gradient dropping: push the top 1 % per layer of "
                  "the accumulated lr-scaled gradient, keep the rest; the parameter server "
                  "answers the dense model", options=SparseOptions, parameter_server=True,
                  server_rule=lambda w, lr, o, layout, workers: SparseApplyRule(w, lr),
                  lr_note="worker rate"))
