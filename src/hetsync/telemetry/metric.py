"""The figure of merit a run is judged by: test accuracy (higher is better) for the image sets,
validation loss (lower is better) for language modelling. Time-to-target, the final and best
figures, the plots, the live page and the bench read it from here, by the run's data set."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from hetsync.data.datasets import TEXT_DATASETS

__all__ = ["Metric", "ACCURACY", "LOSS", "metric_of", "metric_of_summary", "bits"]


@dataclass(frozen=True)
class Metric:
    """One figure of an evaluation record: its key, how it is labelled, which way is better."""

    key: str             # the evaluation record's field
    label: str           # axis label
    short: str           # the summary's word: final_<short>, best_<short>; the tables'
    higher_is_better: bool
    default_targets: tuple[float, ...]

    def reached(self, value: float, target: float) -> bool:
        """Whether `value` is at `target` or better."""
        return value >= target if self.higher_is_better else value <= target

    def best(self, values: Iterable[float]) -> float | None:
        return (max if self.higher_is_better else min)(values, default=None)

    def of(self, record: Mapping[str, Any]) -> float | None:
        value = record.get(self.key)
        return None if value is None else float(value)

    def show(self, record: Mapping[str, Any] | None) -> str:
        """The progress lines' word: ``acc 0.8512``, ``loss 1.8523``; a dash before any."""
        value = None if record is None else self.of(record)
        word = "acc" if self.higher_is_better else "loss"
        return f"{word} —" if value is None else f"{word} {value:.4f}"

    def check_target(self, target: float) -> float:
        """`target`, or ValueError saying what a target of this metric is."""
        if self.higher_is_better and not 0 < target <= 1:
            raise ValueError(f"invalid target {target:g}; expected an accuracy in (0, 1]")
        if not target > 0:
            raise ValueError(f"invalid target {target:g}; expected a loss > 0")
        return target


ACCURACY = Metric("test_acc", "test accuracy", "accuracy", True, (0.7, 0.8, 0.85, 0.9))
LOSS = Metric("test_loss", "validation loss (nats per character)", "loss", False,
              (2.2, 2.0, 1.9, 1.8))


def metric_of(dataset: str | None) -> Metric:
    """The figure of merit of a run on `dataset`."""
    return LOSS if dataset in TEXT_DATASETS else ACCURACY


def metric_of_summary(summary: Mapping[str, Any]) -> Metric:
    """The figure of merit a summary's times to target are of."""
    return LOSS if summary.get("metric") == LOSS.key else ACCURACY


def bits(loss: float | None) -> float | None:
    """A loss in nats per character as bits per character."""
    return None if loss is None else loss / math.log(2)
