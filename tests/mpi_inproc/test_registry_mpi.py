"""Invariants every registered strategy keeps, looped over the registry: the tests that run in
process on every rank (pytest-mpi).

Split off unit/test_registry.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import slow_unless, train_config
from test_registry import STRATEGIES

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.analysis.summary import summarize

#: Optional flags that make a strategy do its characteristic thing within a
#: tiny budget (a strategy not named here runs with its defaults).
QUICK: dict[str, list[str]] = {
    "odsgd": ["--warmup-steps", "2"],  # its Iallreduce is in flight from step 2 on
    "localsgd": ["--period", "4"],
    "oscars": ["--period", "2"],
    "slowmo": ["--period", "4"],
    "diloco": ["--inner-steps", "4", "--sync-warmup", "2", "--lr", "0.002"],
    # one rank per group stands in for a node each (every rank here shares one host)
    "hierarchical": ["--group-size", "1", "--node-period", "2", "--global-period", "4"],
}


SAMPLES, BATCH = 512, 16


SMALL = ["--dataset", "synthetic", "--synthetic-samples", str(SAMPLES),
         "--batch-size", str(BATCH), "--progress", "never"]


def flags(name: str, *extra: str) -> list[str]:
    return [*SMALL, "--algorithm", name, *QUICK.get(name, []), *extra]


def _train(name: str, out: Path, *extra: str) -> dict | None:
    from mpi4py import MPI

    from syncbench.bench.train.driver import run_training

    return run_training(train_config(*flags(name, "--out", str(out), *extra)), MPI.COMM_WORLD)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", STRATEGIES)
def test_budget_and_run_file_round_trip(name, shared_tmp):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out = shared_tmp / f"{name}.h5"
    summary = _train(name, out, "--eval-every", "0.5")
    world.Barrier()
    run = read_run(out)
    size = world.Get_size()
    budget = SAMPLES // size // BATCH * BATCH * size
    # the exact sample budget, whatever ranks the strategy trains on
    assert sum(int(rows["samples"].sum()) for rows in run.ranks.values()) == budget
    assert run.eval["samples_seen"][-1] == budget
    # every schema name is written and read back
    assert set(schema.ROOT_ATTRS) - set(schema.OPTIONAL_ROOT_ATTRS) <= set(run.attrs)
    assert run.attrs["algorithm"] == name and run.world_size == size
    # the strategy's own traits travel in the file (a registered Throwaway's too)
    assert schema.strategy_traits(run.attrs) == ALGORITHMS[name].traits.in_file()
    assert sorted(run.ranks) == list(range(size))
    for rank, rows in run.ranks.items():
        assert set(schema.RANK_COLUMNS) <= set(rows)
        assert len({len(col) for col in rows.values()}) == 1
        np.testing.assert_array_equal(rows["step"], np.arange(len(rows["step"])))
        assert set(schema.RANK_ATTRS) <= set(run.rank_attrs[rank])
    assert set(schema.EVAL_COLUMNS) <= set(run.eval)
    assert set(schema.SUMMARY_ATTRS) <= set(run.summary)
    # the summary in the file is the one its own rows give
    again = summarize(run.ranks, run.eval, run.summary["wall_s"], None)
    for key in schema.SUMMARY_ATTRS:
        np.testing.assert_allclose(again[key], run.summary[key], equal_nan=True)
    if world.Get_rank() == 0:
        assert summary is not None and summary["final_accuracy"] == run.summary["final_accuracy"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", slow_unless(
    [n for n in STRATEGIES if ALGORITHMS[n].traits.deterministic],
    {"ssgd", "dpsgd", "throwaway"}))
def test_a_fixed_seed_gives_the_same_run(name, shared_tmp):
    tmp = shared_tmp
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    runs = []
    for tag in ("a", "b"):
        _train(name, tmp / f"{tag}.h5", "--seed", "5", "--dtype", "float64",
               "--save-model", str(tmp / f"{tag}.npy"))
        world.Barrier()
        runs.append(read_run(tmp / f"{tag}.h5"))
    a, b = runs
    np.testing.assert_array_equal(np.load(tmp / "a.npy"), np.load(tmp / "b.npy"))
    for rank in a.ranks:
        np.testing.assert_array_equal(a.ranks[rank]["loss"], b.ranks[rank]["loss"])
    np.testing.assert_array_equal(a.eval["accuracy"], b.eval["accuracy"])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name",
                         [n for n in STRATEGIES if ALGORITHMS[n].traits.supports_stop_at_target])
def test_stop_at_target_ends_every_rank_at_the_first_evaluation_that_reaches_it(name, shared_tmp):
    """The Evaluator hook's stop is a collective decision (the accuracy is broadcast)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out = shared_tmp / f"{name}.h5"
    _train(name, out, "--epochs", "2", "--eval-every", "0.25", "--target-accuracy", "0.05",
           "--stop-at-target")
    world.Barrier()
    run = read_run(out)
    size = world.Get_size()
    budget = 2 * (SAMPLES // size // BATCH) * BATCH * size
    seen = run.eval["samples_seen"]
    assert run.eval["accuracy"][0] >= 0.05  # chance is 0.1: the first evaluation stops it
    assert len(seen) == 1 and seen[0] < budget
    assert sum(int(rows["samples"].sum()) for rows in run.ranks.values()) == seen[0]
