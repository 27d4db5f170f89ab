"""Fair learning rates for the bench: one rule per mode, or the best of a short sweep.

Linear scaling (Goyal et al. 2017), the default:

- synchronous data-parallel modes (`sync`, `ddp`) average P workers' gradients every step, an
  effective batch of P·b, so they train at lr × P;
- `esync` and `localsgd` average models after local steps: each local step is plain SGD on b
  samples, so they keep the base rate as their local rate (ESync's global rate is 1);
- `async`, `dcasgd` apply one worker's gradient (batch b) at a time, and `local` is one worker:
  the base rate.

`--lr-sweep` replaces the rule: every mode trains briefly at each listed rate (used as the
mode's own rate, no scaling) and keeps the one with the best test accuracy at the end of its
sweep run; a rate whose run diverges or fails is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

#: Modes whose rate is scaled by the number of workers (one averaged gradient per step).
SCALED_MODES = ("sync", "ddp")


@dataclass(frozen=True)
class LrChoice:
    """The rate a mode trains at, and how it was chosen (for the table)."""

    lr: float
    how: str

    def __str__(self) -> str:
        return f"{self.lr:g} ({self.how})"


def linear_scaling(mode: str, base_lr: float, workers: int) -> LrChoice:
    """The default rule (see the module docstring)."""
    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr}")
    if mode in SCALED_MODES and workers > 1:
        return LrChoice(base_lr * workers, f"{base_lr:g} x {workers} workers")
    if mode in ("esync", "localsgd"):
        return LrChoice(base_lr, "base, local" + (", global 1" if mode == "esync" else ""))
    return LrChoice(base_lr, "base")


def best_of_sweep(accuracies: Mapping[float, float | None]) -> LrChoice:
    """The rate with the best accuracy (the smaller rate on a tie); `None` = diverged/failed.

    Raises ValueError when every rate failed.
    """
    done = {lr: acc for lr, acc in accuracies.items() if acc is not None}
    if not done:
        raise ValueError(f"every rate of the sweep failed: {sorted(accuracies)}")
    best = max(sorted(done), key=lambda lr: done[lr])
    tried = ", ".join(f"{lr:g}:{'failed' if acc is None else format(acc, '.3f')}"
                      for lr, acc in sorted(accuracies.items()))
    return LrChoice(best, f"sweep {tried}")


def config_overrides(mode: str, lr: float) -> dict:
    """Config fields that make `mode` train at `lr` (ESync: local rate, global rate 1)."""
    if mode == "esync":
        return {"lr": lr, "local_lr": lr, "global_lr": 1.0}
    return {"lr": lr}
