"""Fair learning rates for the bench: one rule per mode, or the best of a short sweep.

Linear scaling (Goyal et al. 2017), the default, as each mode's registry entry says
(`ModeSpec.lr_scaling`):

- synchronous data-parallel modes (`sync`, `ddp`) average P workers' gradients every step, an
  effective batch of P·b, so they train at lr × P (with `--balanced-batches`, × Σb_i/b: the
  batches of b a step holds, `Config.batches_per_step`);
- `esync` and `post-local-sgd` average models after local steps: each local step is plain SGD
  on b samples, so they keep the base rate as their local rate (ESync's global rate is 1);
- `async`, `dcasgd` apply one worker's gradient (batch b) at a time, and `local` is one worker:
  the base rate.

With AdamW (`--optimizer adamw`) the synchronous modes take the square-root rule instead,
lr × √P (Malladi et al. 2022, "On the SDEs and scaling rules for adaptive gradient
algorithms"): Adam's step does not grow with the gradient's size, and the averaged gradient's
noise falls as 1/P.

`--lr-sweep` replaces the rule: every mode trains `--sweep-budget` s at each listed rate (used
as the mode's own rate, no scaling) and keeps the one with the best test accuracy at the end of
its sweep run, its only evaluation; a rate whose run diverges or fails is skipped; a best at
the sweep's lowest or highest rate is marked as such in the table (widen the sweep). The best
rate depends on the horizon: a trial as long as the runs chooses for their final accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

@dataclass(frozen=True)
class LrChoice:
    """The rate a mode trains at, and how it was chosen (for the table)."""

    lr: float
    how: str

    def __str__(self) -> str:
        return f"{self.lr:g} ({self.how})"


def linear_scaling(mode: str, base_lr: float, workers: float, optimizer: str = "sgd",
                   global_lr: float | None = None) -> LrChoice:
    """The default rule (see the module docstring); `workers`: batches of -b per step (P, or
    Σ b_i / b with --balanced-batches); `global_lr`: the mode's global (outer, server) rate
    where `--global-lr` gives it, named in place of the default that the mode's note names."""
    from hetsync.algorithms import registry

    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr}")
    spec = registry.get(mode)
    if spec.lr_scaling == "workers" and workers > 1:
        if optimizer == "adamw":
            return LrChoice(base_lr * workers ** 0.5,
                            f"{base_lr:g} x sqrt({workers:.4g} workers' batches)")
        return LrChoice(base_lr * workers, f"{base_lr:g} x {workers:.4g} workers' batches")
    note = spec.rate_note(global_lr)
    return LrChoice(base_lr, "base" if note == "base" else f"base, {note}")


def best_of_sweep(accuracies: Mapping[float, float | None],
                  higher_is_better: bool = True) -> LrChoice:
    """The rate with the best final figure — accuracy, or with `higher_is_better` False a
    loss — (the smaller rate on a tie); `None` = diverged/failed.

    Raises ValueError when every rate failed.
    """
    done = {lr: acc for lr, acc in accuracies.items() if acc is not None}
    if not done:
        raise ValueError(f"every rate of the sweep failed: {sorted(accuracies)}")
    sign = 1 if higher_is_better else -1
    best = max(sorted(done), key=lambda lr: sign * done[lr])
    tried = ", ".join(f"{lr:g}:{'failed' if acc is None else format(acc, '.3f')}"
                      for lr, acc in sorted(accuracies.items()))
    # the best of a sweep that did not bracket it is a bound, not a choice: say so
    edge = ("" if len(accuracies) == 1 else
            "; the lowest tried: a lower rate may be better" if best == min(accuracies) else
            "; the highest tried: a higher rate may be better" if best == max(accuracies) else "")
    return LrChoice(best, f"sweep {tried}{edge}")
