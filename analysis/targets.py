"""A run's target: the test accuracy or the validation loss whose time is the headline.

A classifier is judged by its test accuracy, reached at the first evaluation with
``accuracy >= target`` (``--target-accuracy``). A language model is judged by its
validation loss in nats per token, reached at the first evaluation with
``loss <= target`` (``--target-loss``), the way DiLoCo and Streaming DiLoCo report
their language models (Douillard et al., arXiv 2311.08105 and 2501.18512: time and
tokens to an evaluation loss). A run has one target or none; the time to it is
``time_to_target_s`` either way, so every table, ratio and plot of a time to target
reads both kinds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The evaluation column each kind of target reads, and whether lower is better.
METRICS = {"accuracy": False, "loss": True}


@dataclass(frozen=True)
class Target:
    """``metric`` ("accuracy" or "loss") and the ``value`` that reaches it.

    Formats as its value (``f"{target:g}"``), so a table header written for an
    accuracy reads a loss the same way.
    """

    metric: str
    value: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown target metric {self.metric!r}; "
                             f"metrics: {', '.join(METRICS)}")

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def flag(self) -> str:
        """The train flag that sets it (``--target-accuracy``, ``--target-loss``)."""
        return f"--target-{self.metric}"

    @property
    def key(self) -> str:
        """Its key in a run's config and the report's rows (``target_loss``, ...)."""
        return f"target_{self.metric}"

    @property
    def lower_is_better(self) -> bool:
        return METRICS[self.metric]

    def describe(self) -> str:
        """``target accuracy 0.8``, ``target loss 1.6 nats/token``."""
        unit = " nats/token" if self.metric == "loss" else ""
        return f"target {self.metric} {self.value:g}{unit}"

    def reached(self, values: np.ndarray) -> np.ndarray:
        """Which of an evaluation column's ``values`` reach it (NaN never does)."""
        values = np.asarray(values, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return values <= self.value if self.lower_is_better else values >= self.value

    def kwargs(self) -> dict[str, float]:
        """``{"target_accuracy": v}`` or ``{"target_loss": v}``: the keyword arguments of
        the functions that take either (``table_rows``, ``run_metrics``)."""
        return {self.key: self.value}


def target_of(accuracy: float | None, loss: float | None) -> Target | None:
    """The target of ``--target-accuracy`` / ``--target-loss`` (checked by
    :func:`target_problem`); None when neither is given."""
    if loss is not None:
        return Target("loss", float(loss))
    if accuracy is not None:
        return Target("accuracy", float(accuracy))
    return None


def target_problem(accuracy: float | None, loss: float | None) -> str | None:
    """One line on what is wrong with the two target flags, else None.

    Both at once is refused: a run's time to target is one number, and a classifier
    and a language model are judged by different measures.
    """
    if accuracy is not None and loss is not None:
        return ("--target-accuracy and --target-loss: give one target (an accuracy for a "
                "classifier, a validation loss for a language model)")
    if accuracy is not None and not 0 < accuracy <= 1:
        return f"--target-accuracy must be in (0, 1], got {accuracy}"
    if loss is not None and not (math.isfinite(loss) and loss > 0):
        return f"--target-loss must be a finite loss in nats per token > 0, got {loss}"
    return None


def config_target(config: Mapping[str, Any]) -> Target | None:
    """The target a run was trained with (its config's ``target_accuracy`` or
    ``target_loss``; files written before ``--target-loss`` have only the first)."""
    def number(key: str) -> float | None:
        value = config.get(key)
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None

    return target_of(number("target_accuracy"), number("target_loss"))


def scored_by_accuracy(eval_rows: Mapping[str, Any]) -> bool:
    """Whether a run's evaluations hold an accuracy (a classifier); a language model's
    are NaN, absent (the evaluator's convention)."""
    accuracy = np.asarray(eval_rows.get("accuracy", ()), dtype=np.float64)
    return bool(accuracy.size and np.isfinite(accuracy).any())


def loss_target_problem(runs: Any) -> str | None:
    """``--target-loss`` over ``runs`` (read run files): one line naming the first run
    scored by accuracy, else None."""
    for run in runs:
        if scored_by_accuracy(run.eval):
            return (f"--target-loss: {run.path} is a classifier ({run.dataset}), scored by "
                    "its test accuracy: give --target-accuracy; a loss target applies to "
                    "language-model runs")
    return None
