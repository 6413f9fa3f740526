"""A diverged run is marked in its run file and warned about once by ``train``.

Serial; the end-to-end tests launch their own ``mpiexec`` and are skipped
when pytest itself runs under mpiexec.

Split off this module: ``tests/e2e/test_divergence_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.analysis.runfile import Run
from syncbench.analysis.summary import divergence, run_diverged


def _rows(loss):
    loss = np.asarray(loss, dtype=float)
    return {"step": np.arange(loss.size), "loss": loss}


def _evals(accuracy):
    return {"accuracy": np.asarray(accuracy, dtype=float)}


def test_non_finite_training_loss_on_any_rank_diverges():
    rows = {0: _rows([2.3, 1.0, 0.5]), 1: _rows([2.3, np.inf, np.nan])}
    assert divergence(rows, _evals([0.9]), 10) == "non-finite training loss on rank 1 at step 1"
    assert divergence({0: _rows([np.nan])}, _evals([]), None) is not None


@pytest.mark.parametrize(
    ("accuracy", "classes", "diverged"),
    [(0.15, 10, True), (0.1501, 10, False), (0.10, 10, True), (0.80, 10, False),
     (0.70, 2, True), (0.76, 2, False), (float("nan"), 10, True)],
)
def test_final_accuracy_at_most_one_and_a_half_times_chance_diverges(accuracy, classes,
                                                                      diverged):
    rows = {0: _rows([2.3, 1.0])}
    reason = divergence(rows, _evals([0.9, accuracy]), classes)
    assert (reason is not None) == diverged
    if diverged:
        assert "x chance" in reason


def test_only_the_final_accuracy_counts_and_no_classes_skips_it():
    rows = {0: _rows([1.0])}
    assert divergence(rows, _evals([0.1, 0.85]), 10) is None  # recovered by the end
    assert divergence(rows, _evals([0.05]), None) is None
    assert divergence(rows, _evals([]), 10) is None


def test_run_diverged_reads_the_flag_and_recomputes_it_for_older_files():
    def run(extra, dataset, accuracy):
        return Run(path="mem", attrs={"dataset": dataset}, ranks={0: _rows([1.0])},
                   rank_attrs={0: {}}, eval=_evals([accuracy]), summary={},
                   summary_extra=extra)

    assert run_diverged(run({"diverged": True}, "fashion-mnist", 0.9))
    assert not run_diverged(run({"diverged": False}, "fashion-mnist", 0.1))
    assert run_diverged(run({}, "fashion-mnist", 0.1))  # older file: 10 known classes
    assert not run_diverged(run({}, "fashion-mnist", 0.8))
    assert not run_diverged(run({}, "synthetic", 0.1))  # classes unknown: loss test only
