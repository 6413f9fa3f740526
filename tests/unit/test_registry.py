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

Split off this module: ``tests/mpi_inproc/test_registry_mpi.py`` (its in-process MPI tests)
and ``tests/e2e/test_registry_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np
import pytest
from helpers import train_args, train_config

from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import add_option_flags, option, options_from
from syncbench.algorithms.reducers import GradientReducer, mean_in_place
from syncbench.algorithms.registry import ALGORITHMS, register
from syncbench.algorithms.ssgd import SSGD
from syncbench.algorithms.traits import StrategyTraits
from syncbench.analysis import schema


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
        SSGD.traits, step_order=("data", "compute", "comm", "wait", "delay", "update", "codec"),
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
    # every one here that declares a pattern is simulated
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


# -- serial: each test launches its own job -----------------------------------------
