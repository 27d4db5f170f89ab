"""Each worker's plan: its emulated device, its batch and its share, decided once per rank.

`Config` holds what the user asked for, and what `launch` resolved before any worker started
(the slowdowns fitted into the cores, the measured reference step), both recorded in the run's
`config.json`. `RankPlan.of(cfg, rank)` reads them once; the worker then passes the plan whole:
to its device's step timer (`timer`), to the training loop (its own batch), to the mode's
communication context (its sample weight) and to `run.json` (`entry`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsync.config import Config
from hetsync.runtime.emulation import nominal_speed
from hetsync.runtime.heterogeneity import RandomStraggler, StepTimer, straggler_of


@dataclass(frozen=True)
class RankPlan:
    """One worker's device and share of the work, as its run's config decides them."""

    rank: int
    #: its device's slowdown against the reference device (scaled by --speed-scale)
    slowdown: float
    #: its own batch (-b, or balanced to its speed with --balanced-batches)
    batch: int
    #: its share of a step's samples × P (1 when every batch is -b)
    sample_weight: float
    #: the reference device's seconds for this batch (None: measured by the timer)
    step_work: float | None
    #: its device's seconds per step whatever the batch (a profile's)
    step_overhead: float
    #: samples per second of computing at its nominal speed (None: no reference step)
    nominal_speed: float | None
    #: its random straggler (--straggle-prob; None: none)
    straggler: RandomStraggler | None
    #: the virtual clock's jitter of its steps (σ and the draw), and the draws' seed
    jitter: float
    jitter_distribution: str
    seed: int

    @classmethod
    def of(cls, cfg: Config, rank: int) -> "RankPlan":
        batch, work = cfg.batch_of(rank), cfg.step_work_of(rank)
        return cls(rank=rank, slowdown=cfg.slowdown_of(rank), batch=batch,
                   sample_weight=cfg.sample_weight_of(rank), step_work=work,
                   step_overhead=cfg.step_overhead_of(rank),
                   nominal_speed=nominal_speed(batch, cfg.slowdown_of(rank), work),
                   straggler=straggler_of(cfg, rank), jitter=cfg.step_jitter,
                   jitter_distribution=cfg.jitter_distribution, seed=cfg.seed * 7919 + rank)

    def timer(self, clock, cpu_device: bool) -> StepTimer:
        """Its device's step timer on `clock` (`Config.make_clock`)."""
        return StepTimer(self.slowdown, cpu_device=cpu_device, straggler=self.straggler,
                         work=self.step_work, clock=clock, jitter=self.jitter, seed=self.seed,
                         jitter_distribution=self.jitter_distribution,
                         fixed=self.step_overhead)

    def entry(self) -> dict:
        """What run.json says of this worker that its plan decides."""
        return {"rank": self.rank, "slowdown": self.slowdown, "batch": self.batch,
                "sample_weight": self.sample_weight, "nominal_speed": self.nominal_speed,
                "role": "worker"}
