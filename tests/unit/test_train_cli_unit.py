"""End-to-end ``syncbench train`` under mpiexec: run files, setup errors, exits.

These tests launch their own ``mpiexec`` (serial pytest run); each is bounded
by a subprocess timeout so a hang fails instead of blocking CI.

Split off ``tests/e2e/test_train_cli.py``: the tests that compute in the test's process (no
process launched, no MPI).
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest


def test_strategy_flags_are_each_strategys_own(monkeypatch):
    """Which flag a strategy takes is what its Options declare: another strategy's flag is
    refused, one left at (or set to) its default is not, an inherited field is shared, and
    a strategy registered later gets the same check without a list to update."""
    from helpers import train_args

    from syncbench.algorithms.base import Strategy
    from syncbench.algorithms.flags import option
    from syncbench.algorithms.registry import ALGORITHMS, option_owners
    from syncbench.bench.train.options import check_strategy_flags

    owners = option_owners()
    # Oscars and SlowMo inherit Local SGD's field
    assert owners["period"][1] == ("localsgd", "oscars", "slowmo")
    # SSGD's subclasses share its options (tests/unit/test_registry.py's throwaway, when loaded)
    assert owners["comm"][1][0] == "ssgd" and "localsgd" not in owners["comm"][1]
    assert owners["ps_layout"][1] == ("asgd",)
    check_strategy_flags(train_args("--algorithm", "ssgd"))  # every default: no error
    for typed in (["--period", "4"], ["--period=4"]):  # the default, typed: refused
        with pytest.raises(ValueError, match="^--period 4 applies to --algorithm localsgd, "
                           "oscars and slowmo only, not to ssgd$"):
            check_strategy_flags(train_args("--algorithm", "ssgd", *typed))
    with pytest.raises(ValueError, match="^--adaptive applies to --algorithm oscars only"):
        check_strategy_flags(train_args("--algorithm", "ssgd", "--adaptive"))  # on: default
    with pytest.raises(ValueError, match="^--no-adaptive applies to --algorithm oscars only"):
        check_strategy_flags(train_args("--algorithm", "ssgd", "--no-adaptive"))
    check_strategy_flags(train_args("--algorithm", "localsgd", "--period", "4"))  # its own
    check_strategy_flags(train_args("--algorithm", "oscars", "--period", "2",
                                      "--momentum-sync", "average"))
    with pytest.raises(ValueError, match="--period 2 applies to --algorithm localsgd, "
                       "oscars and slowmo only, not to ssgd"):
        check_strategy_flags(train_args("--algorithm", "ssgd", "--period", "2"))

    @dataclasses.dataclass(frozen=True)
    class Options:
        fanout: int = option(2, "fan-out")

    class Fanout(Strategy):
        name = "fanout"

    Fanout.Options = Options
    monkeypatch.setitem(ALGORITHMS, "fanout", Fanout)
    assert option_owners()["fanout"][1] == ("fanout",)
    with pytest.raises(ValueError, match="--fanout 3 applies to --algorithm fanout only"):
        check_strategy_flags(train_args("--algorithm", "ssgd", fanout=3))
    check_strategy_flags(train_args(algorithm="fanout", fanout=3))
    with pytest.raises(ValueError, match="--comm blocking applies to --algorithm ssgd"):
        check_strategy_flags(train_args("--comm", "blocking", algorithm="fanout"))


def test_shipped_scenarios_plan_and_a_foreign_flag_is_refused_before_any_launch(tmp_path):
    """Every shipped scenario still plans (train's flag checks included, as --dry-run
    makes them); a run entry, or a pass-through flag, that gives a strategy another's
    flag, or a --data-dir without the data, is one ScenarioError before anything runs."""
    from syncbench.bench.experiment.plan import plan_runs
    from syncbench.bench.experiment.scenario import (
        ScenarioError,
        load_scenario,
        parse_scenario,
        shipped_scenarios,
    )

    for name in shipped_scenarios():
        scenario = load_scenario(name)
        np_ = scenario.nps[0] if scenario.scaling else scenario.np
        assert plan_runs(scenario, np_, 1, 0, tmp_path, [], scenario.target)
    bad = parse_scenario({"np": 2, "run": [
        {"label": "a", "algorithm": "ssgd"},
        {"label": "b", "algorithm": "localsgd", "flags": {"comm": "blocking"}}]}, "bad", "bad")
    with pytest.raises(ScenarioError, match="run 'b'.*--comm blocking applies to "
                       "--algorithm ssgd( and throwaway)? only, not to localsgd"):
        plan_runs(bad, 2, 1, 0, tmp_path, [], 0.5)
    demo = load_scenario("demo")
    for value in ("8", "4"):  # 4, Local SGD's default, typed: SSGD's runs refuse it too
        with pytest.raises(ScenarioError, match=f"--period {value} applies to --algorithm "
                           "localsgd"):
            plan_runs(demo, 2, 1, 0, tmp_path, ["--period", value], 0.5)
    typed = parse_scenario({"np": 2, "flags": {"period": 4}, "run": [
        {"label": "a", "algorithm": "ssgd"}]}, "typed", "typed")
    with pytest.raises(ScenarioError, match="run 'a'.*--period 4 applies to"):
        plan_runs(typed, 2, 1, 0, tmp_path, [], 0.5)
    with pytest.raises(ScenarioError, match="--data-dir /nonexistent/data does not exist"):
        plan_runs(demo, 2, 1, 0, tmp_path, ["--data-dir", "/nonexistent/data"], 0.5)


def test_peers_gives_its_period_to_local_sgd_alone(tmp_path):
    """syncbench peers' --period is Local SGD's (and the peer's): our SSGD run does not get
    it, so train does not refuse it."""
    from syncbench.bench.commands.peers import add_arguments
    from syncbench.bench.experiment.peers.pairs import plan_cell

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--repeats", "1", "--period", "8"])
    ssgd, ssgd_peer = plan_cell(args, 2, "mlp", "ssgd", tmp_path)
    local, _ = plan_cell(args, 2, "mlp", "localsgd", tmp_path)
    assert "--period" not in ssgd.args and "--period" in ssgd_peer.args
    assert local.args[local.args.index("--period") + 1] == "8"
    # --train-flags: a strategy's option goes to that strategy's runs alone (its help's
    # example, '--comm blocking', would otherwise end the Local SGD run)
    args = parser.parse_args(["--repeats", "1", "--train-flags", "--comm blocking --lr 0.2"])
    ssgd, _ = plan_cell(args, 2, "mlp", "ssgd", tmp_path)
    local, _ = plan_cell(args, 2, "mlp", "localsgd", tmp_path)
    assert ssgd.args[ssgd.args.index("--comm") + 1] == "blocking"
    assert "--comm" not in local.args and local.args[local.args.index("--lr") + 1] == "0.2"
