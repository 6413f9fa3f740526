"""Invariants every registered strategy keeps, looped over the registry.

As mpi4py's ``test/arrayimpl.py`` loops its tests over every array backend,
these loop over :data:`~syncbench.algorithms.registry.ALGORITHMS`: a new
strategy is tested by registering it, with no edit here. :class:`Throwaway`
below shows it: it is defined and registered in this module only, and every
test runs on it as on the built-in strategies (in the ranks that ``mpiexec``
starts, too: ``SYNCBENCH_STRATEGIES`` names this module there). What analysis and
the simulator know of a strategy are its traits (``Strategy.traits``, written to the
run file): Throwaway, composed of a reducer of its own and the core, declares its own
step order and label variant and SSGD's simulation, and gets its trace, its table
label and its simulation with no edit elsewhere.

- in-process under ``mpiexec -n 2``/``-n 4 ... --only-mpi``: the exact sample
  budget, the run-file schema round-trip, determinism under a fixed seed (for
  strategies that declare ``deterministic``);
- serial, each launching its own small job: a fault ends the job within a
  bound, and a crash is resumed from the last checkpoint (to the same
  parameters for deterministic strategies).

Budgets are tiny (the synthetic dataset, a few steps per rank): these tests
check bookkeeping, not training.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_mpi, slow_unless, train_args, train_config
from sim_helpers import needs_simgrid, simulate

from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import add_option_flags, option, options_from
from syncbench.algorithms.reducers import GradientReducer, mean_in_place
from syncbench.algorithms.registry import ALGORITHMS, PLUGINS_ENV, register
from syncbench.algorithms.ssgd import SSGD
from syncbench.algorithms.traits import StrategyTraits
from syncbench.analysis import schema
from syncbench.analysis.report import report_rows
from syncbench.analysis.runfile import read_run
from syncbench.analysis.summary import summarize
from syncbench.analysis.trace import trace_events


class Float16Rounded(GradientReducer):
    """float16-rounded gradient, one Allreduce, the straggler's delay; mean or sum."""

    def complete(self) -> Any:
        grads = self.core.model.grads
        grads[...] = grads.astype(np.float16)
        self.core.comm.Allreduce(grads)
        self.core.straggle()
        return grads if self.core.options.sum_gradients else mean_in_place(self.core, grads)


@register
class Throwaway(Strategy):
    """SSGD from parts: the reducer above and the core's momentum SGD."""

    name = "throwaway"
    summary = "test only: a strategy registered from a test module"
    traits = dataclasses.replace(
        SSGD.traits, step_order=("data", "compute", "comm", "wait", "delay", "update"),
        label_variants=(("sum_gradients", True, "+sum"),))

    @dataclasses.dataclass(frozen=True)
    class Options(SSGD.Options):
        sum_gradients: bool = option(
            False, "throwaway: apply the sum of the gradients, not their mean", flag=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reducer = Float16Rounded(self)

    def step(self, x: Any, y: Any) -> StepStats:
        loss = self.compute_gradient(x, y)
        grads = self.reducer.complete()
        with self.timer.phase("update"):
            self.optimizer.step(self.model.params, grads)
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]))


STRATEGIES = sorted(ALGORITHMS)

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

#: Phase where the injected fault fires (default compute): ASGD's RMA epochs are comm.
FAULT_PHASE: dict[str, str] = {"asgd": "comm"}
#: Step where it fires (default 6). Where ranks take different numbers of steps, rank 1
#: may never reach step 6 of the tiny budget (seen under Open MPI): Oscars gives a slow
#: rank fewer local steps after round 0 (``--period`` steps for every rank), and an ASGD
#: worker takes the tickets it claims first. Step 1 is in round 0 / the second push.
FAULT_STEP: dict[str, int] = {"oscars": 1, "asgd": 1}

#: (--checkpoint-every, step of rank 1's fault) of the crash-and-resume test. An ASGD
#: worker's share of the 64 tickets is uneven on a loaded host, so its fault fires early,
#: at step 12: any rank's step 12 comes after the first pause (every 4 x 2 = 8 tickets,
#: a barrier of all ranks), so a checkpoint always precedes the crash.
CRASH: dict[str, tuple[int, int]] = {"asgd": (4, 12)}

SAMPLES, BATCH = 512, 16
SMALL = ["--dataset", "synthetic", "--synthetic-samples", str(SAMPLES),
         "--batch-size", str(BATCH), "--progress", "never"]

#: Seconds from launch within which a job with a failing rank must have ended.
ABORT_BOUND_S = 20.0


def flags(name: str, *extra: str) -> list[str]:
    return [*SMALL, "--algorithm", name, *QUICK.get(name, []), *extra]


def test_the_throwaway_strategy_is_registered_and_has_train_flags(capsys):
    from syncbench.bench.cli import build_parser

    assert ALGORITHMS["throwaway"] is Throwaway and "throwaway" in STRATEGIES
    with pytest.raises(SystemExit):
        build_parser("train").parse_args(["train", "--help"])
    assert "throwaway" in capsys.readouterr().out  # listed by --algorithm's help
    assert train_config("--algorithm", "throwaway").algorithm == "throwaway"
    with pytest.raises(ValueError, match="taken"):
        register(type("Other", (Throwaway,), {}))


@pytest.mark.parametrize("name", sorted(schema.LEGACY_TRAITS))
def test_a_shipped_strategy_declares_the_traits_its_old_run_files_imply(name):
    """Files written before ``strategy_traits`` existed read as new files do."""
    assert ALGORITHMS[name].traits.in_file() == schema.LEGACY_TRAITS[name]


def test_traits_default_to_lock_step_and_are_declared_once():
    assert Strategy.traits == schema.StrategyTraits()
    assert schema.StrategyTraits is StrategyTraits  # one type, analysis's and the strategies'
    traits = Throwaway.traits
    assert traits.simulation == SSGD.traits.simulation and traits.hides_comm  # SSGD's
    assert traits.step_order != SSGD.traits.step_order
    assert set(traits.step_order) == set(schema.PHASES)
    assert StrategyTraits.from_json(traits.to_json()) == traits.in_file()


def test_the_simulator_finds_a_strategy_by_its_simulation_pattern(monkeypatch):
    from syncbench.bench.simulate.strategies import (
        SIMULATORS,
        simulated_strategies,
        simulator_for,
    )

    assert simulator_for("throwaway") is SIMULATORS["ssgd"]
    # every one here that declares a pattern is simulated (DiLoCo, hierarchical, D-PSGD: none)
    assert simulated_strategies() == [n for n, c in ALGORITHMS.items() if c.traits.simulation]
    plain = type("Plain", (Throwaway,), {
        "name": "plain", "traits": dataclasses.replace(Throwaway.traits, simulation="")})
    monkeypatch.setitem(ALGORITHMS, "plain", plain)
    assert "plain" not in simulated_strategies()
    with pytest.raises(ValueError, match="no simulated communication pattern"):
        simulator_for("plain")


@pytest.mark.parametrize("name", STRATEGIES)
def test_train_flag_defaults_are_the_options_defaults(name):
    cls = ALGORITHMS[name]
    assert options_from(cls.Options, train_args("--algorithm", name)) == cls.Options()


def test_options_validate_on_construction_and_flags_name_one_option():
    from syncbench.algorithms.localsgd import LocalSGD
    from syncbench.algorithms.oscars import Oscars
    from syncbench.algorithms.ssgd import SSGD

    with pytest.raises(ValueError, match="--period must be >= 1"):
        Oscars.Options(period=0)  # Local SGD's check, inherited with the field
    with pytest.raises(ValueError, match="--bucket-mb"):
        SSGD.Options(bucket_mb=-1.0)
    config = train_config("--algorithm", "oscars", "--period", "3", "--overlap")
    assert options_from(Oscars.Options, config) == Oscars.Options(period=3, overlap=True)
    seen: dict = {}
    parser = argparse.ArgumentParser()
    add_option_flags(parser, LocalSGD.Options, seen)
    add_option_flags(parser, Oscars.Options, seen)  # --period shared by inheritance: added once

    @dataclasses.dataclass(frozen=True)
    class Clash:
        period: int = option(2, "another strategy's period")

    with pytest.raises(ValueError, match="--period of .*Clash"):
        add_option_flags(parser, Clash, seen)


# -- in process, under mpiexec --------------------------------------------------------


def _shared_tmp(comm) -> Path:
    import tempfile

    name = tempfile.mkdtemp(prefix="syncbench-registry-") if comm.Get_rank() == 0 else None
    return Path(comm.bcast(name, root=0))


def _train(name: str, out: Path, *extra: str) -> dict | None:
    from mpi4py import MPI

    from syncbench.bench.train.driver import run_training

    return run_training(train_config(*flags(name, "--out", str(out), *extra)), MPI.COMM_WORLD)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", STRATEGIES)
def test_budget_and_run_file_round_trip(name):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out = _shared_tmp(world) / f"{name}.h5"
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
def test_a_fixed_seed_gives_the_same_run(name):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    tmp = _shared_tmp(world)
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
def test_stop_at_target_ends_every_rank_at_the_first_evaluation_that_reaches_it(name):
    """The Evaluator hook's stop is a collective decision (the accuracy is broadcast)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    out = _shared_tmp(world) / f"{name}.h5"
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


# -- serial: each test launches its own job -----------------------------------------


def _plugin_env() -> dict[str, str]:
    """The environment that imports this module in a ``syncbench`` process (it registers
    Throwaway)."""
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH", "")]))
    return {PLUGINS_ENV: Path(__file__).stem, "PYTHONPATH": path}


def _launch(np_: int, *args: str, timeout: float = 90):
    """``run_mpi`` with this module imported in every rank."""
    return run_mpi(np_, *args, timeout=timeout, env=_plugin_env())


#: The strategies whose launched tests run in ``make test`` (the others' under ``make
#: test-all``): SSGD's Allreduce and ASGD's windows (OD-SGD's checkpoint with a
#: reduction in flight resumes in test_odsgd_mpi, in process).
LAUNCHED_FAST = {"ssgd", "asgd"}


@pytest.mark.mpi_skip
@pytest.mark.parametrize("name", slow_unless(STRATEGIES, {"ssgd", "asgd", "throwaway"}))
def test_a_rank_that_raises_ends_the_job(name):
    fault = f"1:{FAULT_STEP.get(name, 6)}:{FAULT_PHASE.get(name, 'compute')}"
    started = time.monotonic()
    proc = _launch(4, "train", *flags(name, "--inject-fault", fault), timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert elapsed < ABORT_BOUND_S, f"job took {elapsed:.1f} s to end"
    assert "syncbench: rank 1: InjectedFault" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.mpi_skip
@pytest.mark.parametrize("name", slow_unless(
    [n for n in STRATEGIES if ALGORITHMS[n].traits.supports_checkpoint], LAUNCHED_FAST))
def test_resume_after_a_crash(tmp_path, name):
    """A crash after a checkpoint, then ``--resume``: the budget is consumed once.

    A deterministic strategy ends with the parameters and rows of an
    uninterrupted run.
    """
    cls = ALGORITHMS[name]
    run_flags = flags(name, "--epochs", "2", "--dtype", "float64", "--eval-every", "0.5",
                      "--seed", "3")
    out = tmp_path / "crash.h5"
    every, fault_step = CRASH.get(name, (8, 20))
    crash = _launch(2, "train", *run_flags, "--out", str(out), "--checkpoint-every",
                    str(every), "--inject-fault", f"1:{fault_step}")
    assert crash.returncode != 0 and not out.exists()
    resumed = _launch(2, "train", *run_flags, "--out", str(out), "--resume",
                      "--save-model", str(tmp_path / "resumed.npy"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    b = read_run(out)
    assert b.complete and not (tmp_path / "crash.h5.parts").exists()
    budget = 2 * (SAMPLES // 2 // BATCH) * BATCH * 2
    assert sum(int(rows["samples"].sum()) for rows in b.ranks.values()) == budget
    if not cls.traits.deterministic:
        return
    full = _launch(2, "train", *run_flags, "--out", str(tmp_path / "full.h5"),
                   "--save-model", str(tmp_path / "full.npy"))
    assert full.returncode == 0, full.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "full.npy"))
    a = read_run(tmp_path / "full.h5")
    for rank in a.ranks:
        np.testing.assert_array_equal(a.ranks[rank]["step"], b.ranks[rank]["step"])
        np.testing.assert_array_equal(a.ranks[rank]["loss"], b.ranks[rank]["loss"])
    np.testing.assert_array_equal(a.eval["accuracy"], b.eval["accuracy"])


def _phases_of_step(run: Any, rank: int, step: int) -> list[str]:
    """The phases ``syncbench trace`` draws for one step of one rank, in time order."""
    events = [e for e in trace_events(run)["traceEvents"]
              if e.get("cat") == "phase" and e["pid"] == rank and e["args"]["step"] == step]
    return [e["name"] for e in sorted(events, key=lambda e: e["ts"])]


@pytest.mark.mpi_skip
def test_a_run_file_carries_its_strategys_traits_to_trace_and_tables(tmp_path):
    """Without SimGrid: the simulator's writer, given rows, writes Throwaway's traits."""
    from syncbench.bench.simulate.timeline import StepRows
    from syncbench.bench.simulate.writer import write_simulated_run

    rows = StepRows(2)
    for j in range(2):
        rows.add(step=j, t_start=np.full(2, 0.5 * j), t_data=0.01, t_compute=0.1,
                 t_comm=0.05, t_delay=np.array([0.0, 0.2]), t_update=0.01, samples=16)
    out = tmp_path / "throwaway.h5"
    write_simulated_run(str(out), algorithm="throwaway", world_size=2,
                        config={"sum_gradients": True}, rows=rows.arrays(), wall_s=1.0,
                        platform={}, workload={}, simulation={}, extra_root={})
    run = read_run(out)
    assert schema.strategy_traits(run.attrs) == Throwaway.traits.in_file()
    assert _phases_of_step(run, 1, 1) == ["data", "compute", "comm", "delay", "update"]
    assert [row["algorithm"] for row in report_rows([str(out)])] == ["throwaway+sum"]


@needs_simgrid
@pytest.mark.mpi_skip
def test_the_throwaway_strategy_is_simulated_traced_and_labelled(tmp_path):
    """``syncbench simulate --algorithm throwaway``: a run file with Throwaway's traits,
    whose trace follows Throwaway's step order and whose tables carry its label."""
    out = tmp_path / "throwaway.h5"
    proc = simulate("--algorithm", "throwaway", "--np", "4", "--steps", "3",
                    "--comm", "blocking", "--slowdown", "1,1,1,3", "--sum-gradients",
                    "--out", str(out), env=_plugin_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(out)
    assert run.attrs["algorithm"] == "throwaway"
    assert run.attrs[schema.TRAITS_ATTR] == Throwaway.traits.in_file().to_json()
    ran = _phases_of_step(run, 3, 0)
    assert {"comm", "delay"} <= set(ran)  # the slowed rank waits for no one, then straggles
    assert ran == [p for p in Throwaway.traits.step_order if p in ran]
    assert [row["algorithm"] for row in report_rows([str(out)])] == ["throwaway+sum"]

