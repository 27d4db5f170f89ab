"""`diloco`: DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models", 2023), as torchft's `DiLoCo` runs it.

Per round, on every worker:

1. H steps of the worker's inner optimizer (the run's `--optimizer`: SGD with `--momentum`,
   `--nesterov` if given, or AdamW as the paper), its state kept across rounds;
2. all-reduce the deltas Δ_i = w_i − w_global (with the BatchNorm statistics, and the
   training loop's agreement, in the same buffer); D = mean Δ_i;
3. the outer optimizer, SGD with Nesterov momentum (lr 0.7, μ 0.9 as published), steps
   w_global on the pseudo-gradient −D; every worker continues from w_global.

H is the same for every worker, as published: on a heterogeneous cluster the faster workers
wait at the round's all-reduce for the slowest one's H steps (inside the sum: timed as
`comm`). That is what ESync's round length changes (`esync-outer` is this composition with
the state server's plan in place of H), and what `--balanced-batches` evens out (each
device's batch in proportion to its speed, so that H steps take each about as long). It is a
composition of the local-step parts (`hetsync.algorithms.local_rounds`) with
`round_length.FixedSteps`; hetsync departs from the paper in averaging the BatchNorm
statistics with the deltas (the paper's transformers have none).

`--overlap 1` departs from the paper as Streaming DiLoCo's overlapped communication does
(Douillard et al., 2025, one round of delay): step 2's all-reduce runs in the background
during the next round's H steps, and its outer step is applied when it arrives, keeping the
steps taken meanwhile (`LocalRounds`, step 4). The round-end wait for a slower worker's
delta then falls on the next round's end, after H more steps of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetsync.algorithms.local_rounds import LocalRounds, OverlapOptions, global_update
from hetsync.algorithms.outer import OuterOptions, WeightingOptions
from hetsync.algorithms.registry import ModeSpec, register
from hetsync.algorithms.round_length import FixedSteps


@dataclass
class InnerStepsOptions:
    """H, the local steps of a round, shared by the modes that fix it."""

    inner_steps: int = field(default=8, metadata={
        "flags": ("--inner-steps",),
        "help": "H: local steps of the inner optimizer per round (default: 8, the fastest "
                "device's steps per round of ESync on the 1, 2, 4, 8 cluster)"})

    def validate_inner(self) -> None:
        from hetsync.options import invalid_option

        if not 1 <= self.inner_steps <= 1_000_000:
            raise invalid_option(self, "inner_steps", "an integer in 1..1000000")


@dataclass
class DiLoCoOptions(InnerStepsOptions, OverlapOptions, WeightingOptions, OuterOptions):
    """DiLoCo's options: H, whether the sums overlap the next round, the weighting of the
    deltas and the outer step's."""

    def validate(self) -> "DiLoCoOptions":
        self.validate_outer()
        self.validate_weighting()
        self.validate_overlap(False)
        self.validate_inner()
        return self


class DiLoCo(LocalRounds):
    name = "diloco"
    Options = DiLoCoOptions
    defaults = {"global_lr": 0.7, "outer_momentum": 0.9, "weighting": "uniform",
                "drift_correction": "none"}

    def __init__(self, model, optimizer, comm, options: DiLoCoOptions | None = None):
        options = (options or DiLoCoOptions()).validate()
        super().__init__(model, optimizer, comm, options,
                         length=FixedSteps(options.inner_steps),
                         settings=global_update(self.defaults, options),
                         overlap=bool(options.overlap))

    def describe(self):
        return {**super().describe(), "inner_steps": self.options.inner_steps}


register(ModeSpec("diloco", DiLoCo, "H local steps of the inner optimizer on every worker; "
                  "outer Nesterov (lr {global_lr:g}, momentum {outer_momentum:g}) on the mean "
                  "delta (DiLoCo; --weighting samples: by samples)",
                  options=DiLoCoOptions, lr_note="inner rate, outer {global_lr:g}",
                  counts_samples=True, defaults=DiLoCo.defaults))
