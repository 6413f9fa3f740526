"""The experiment runner (``syncbench run``): scenarios, plans, and one real tiny scenario.

The end-to-end test launches real ``mpiexec -n 2 syncbench train`` runs on the
synthetic dataset (a few seconds each) and checks the results file against a
recomputation from the run files it names.

Split off this module: ``tests/e2e/test_runner_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from syncbench.bench.experiment.plan import plan_runs
from syncbench.bench.experiment.scenario import (
    ScenarioError,
    load_scenario,
    parse_scenario,
    shipped_scenarios,
)

SHIPPED = ("demo", "hetero", "overlap", "asgd", "peers", "cluster-overlap", "cluster-hetero",
           "compression", "lm", "diloco")


def scenario_data(**overrides) -> dict:
    data = {"np": 2, "run": [{"label": "a", "algorithm": "ssgd"},
                             {"label": "b", "algorithm": "oscars"}]}
    data.update(overrides)
    return data


# ---------------------------------------------------------------- scenarios


def test_every_shipped_scenario_loads_and_plans():
    assert set(SHIPPED) <= set(shipped_scenarios())
    for name in SHIPPED:
        scenario = load_scenario(name)
        assert scenario.description and scenario.runs
        plan = plan_runs(scenario, scenario.np, 1, 0, Path("/tmp/x"), [], scenario.target)
        assert len(plan) == len(scenario.runs) * len(scenario.conditions(scenario.np))
    # timing scenarios repeat at least 5 times; the demo is a quick look
    assert all(load_scenario(n).repeats >= 5 for n in SHIPPED if n != "demo")


def test_heterogeneous_scenario_gets_the_homogeneous_baseline_at_any_rank_count():
    hetero = load_scenario("hetero")
    for np_, factors in ((2, (1.0, 4.0)), (4, (1.0, 1.0, 1.0, 4.0))):
        conds = hetero.conditions(np_)
        assert conds[0].homogeneous and conds[0].train_flags() == []
        assert [c.mode for c in conds[1:]] == ["sleep", "spin", "work"]
        assert all(c.factors == factors for c in conds[1:])
        assert conds[1].train_flags() == ["--slowdown", ",".join(f"{f:g}" for f in factors),
                                          "--slowdown-mode", "sleep"]


def test_node_speeds_are_configurations_beside_the_slowdowns():
    sc = parse_scenario(scenario_data(slowdowns=["last:4"], slowdown_modes=["work"],
                                      node_speeds=["last:0.25"], cluster={"link": "1gbit"}),
                        "t", "t.toml")
    conds = sc.conditions(4)
    assert [c.key for c in conds] == ["hom", "s1-1-1-4-work", "q1-1-1-0.25"]
    quota = conds[2]
    assert not quota.homogeneous and quota.train_flags() == []
    assert quota.nominal == (1, 1, 1, 4) and quota.title == "node speed 1,1,1,0.25 (CPU quota)"
    assert sc.heterogeneous and sc.ranks_per_node() == 1
    two_per_node = parse_scenario(scenario_data(node_speeds=["last:0.5"],
                                                cluster={"ppn": 2}), "t", "t.toml")
    assert two_per_node.conditions(4)[1].speeds == (1.0, 0.5)  # 2 nodes of 2 ranks


def test_lr_grid_expands_into_labelled_entries():
    overlap = load_scenario("overlap")
    odsgd = [e for e in overlap.runs if e.group == "odsgd"]
    assert [e.label for e in odsgd] == ["odsgd@lr=0.01", "odsgd@lr=0.02", "odsgd@lr=0.05"]
    assert [e.flags[-2:] for e in odsgd] == [("--lr", "0.01"), ("--lr", "0.02"),
                                             ("--lr", "0.05")]
    assert {e.label for e in overlap.runs} >= {"ssgd-overlap", "ssgd-blocking"}


@pytest.mark.parametrize("overrides, message", [
    ({"np": 0}, "'np' must be"),
    ({"repeats": 1.5}, "'repeats' must be a whole number"),
    ({"target_accuracy": 1.2}, "'target_accuracy' must be"),
    ({"headline": "speed"}, "'headline' must be one of"),
    ({"baseline": "zzz"}, "'baseline' 'zzz' is not a run label"),
    ({"slowdowns": ["1,4,4"]}, "has 3 factors but runs have 2 ranks"),
    ({"slowdowns": ["last:0.5"]}, "every factor must be >= 1"),
    ({"slowdown_modes": ["nap"]}, "'slowdown_modes' must be a list of"),
    ({"colour": "red"}, "unknown key(s) colour"),
    ({"flags": {"out": "x.h5"}}, "'out' is set by the runner"),
    ({"flags": {"slowdown": "1,4"}}, "use 'slowdowns'"),
    ({"run": []}, "needs at least one [[run]]"),
    ({"run": [{"label": "a", "algorithm": "nosuch"}]}, "'algorithm' must be one of"),
    ({"run": [{"label": "a b", "algorithm": "ssgd"}]}, "'label' must be letters"),
    ({"run": [{"algorithm": "ssgd"}, {"algorithm": "ssgd"}]}, "duplicate run label(s) ssgd"),
    ({"run": [{"algorithm": "ssgd", "lr_grid": [0.1, -1]}]}, "'lr_grid' must be"),
    ({"run": [{"algorithm": "ssgd", "speed": 2}]}, "unknown key(s) speed"),
    ({"node_speeds": ["1,0.5,0.5"]}, "has 3 speeds but runs use 2 nodes"),
    ({"node_speeds": ["last:2"]}, "each speed must be in [0.01, 1]"),
    ({"node_speeds": "last:0.5"}, "'node_speeds' must be a list"),
    ({"cluster": {"link": "fast"}}, "'link' must be a rate"),
    ({"cluster": {"nodes": 2}}, "cluster: unknown key(s) nodes"),
])
def test_invalid_scenarios_are_one_line_errors(overrides, message):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(scenario_data(**overrides), "t", "t.toml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_file_a_scenario_asks_for_is_written_into_the_out_dir_per_run(tmp_path):
    """``save_model = NAME``: each run writes OUT_DIR/<run id>-NAME; in a scaling plan the
    plan's own flags come after the scenario's and the pass-through ones (they win)."""
    flags = {"dataset": "synthetic", "save_model": "model.npy"}
    plain = parse_scenario(scenario_data(flags=flags), "t", "t.toml")
    scaling = parse_scenario(scenario_data(flags=flags, np=[1, 2]), "s", "s.toml")
    out = tmp_path / "runs"
    plans = (plan_runs(plain, 2, 2, 0, out, [], 0.8),
             plan_runs(scaling, 2, 1, 0, out, ["--lr", "0.1"], 0.8))
    for plan in plans:
        assert plan
        for p in plan:
            i = p.args.index("--save-model")
            assert p.args[i + 1] == str(out / f"{p.run_id}-model.npy")
            assert p.args.count("--save-model") == 1
    for p in plans[1]:
        assert p.args[-7:] == ("--batch-size", str(p.batch_size), "--scaling-mode", "strong",
                               "--out", str(p.path), "--overwrite")
        assert p.args.index("--lr") < p.args.index("--out")


def test_every_train_flag_that_names_a_written_file_is_the_runners_or_in_the_out_dir():
    from syncbench.bench.experiment.plan import train_parser
    from syncbench.bench.experiment.scenario import OUT_DIR_FILES, RESERVED_FLAGS
    from syncbench.bench.train.options import WRITES_FILES

    parser = train_parser()
    assert not parser.allow_abbrev
    words = {"out", "save", "path", "file", "dir", "trace", "log", "dump", "model"}
    pathlike = {a.dest for a in parser._actions
                if a.metavar in ("PATH", "FILE", "DIR") or set(a.dest.split("_")) & words}
    # --data-dir is read, --model and --eval-model name a model, not a file
    assert pathlike == {*WRITES_FILES, "data_dir", "model", "eval_model"}
    assert all(dest in RESERVED_FLAGS or dest in OUT_DIR_FILES for dest in WRITES_FILES)


# ---------------------------------------------------------------- order


def test_run_order_is_randomised_per_repeat_and_seeded():
    scenario = load_scenario("hetero")

    def order(seed: int) -> list[str]:
        return [p.run_id for p in plan_runs(scenario, 2, 3, seed, Path("/tmp/x"), [], 0.8,
                                            check=False)]

    cells = len(scenario.runs) * len(scenario.conditions(2))
    first = order(7)
    assert first == order(7)  # the seed reproduces the order
    assert first != order(8)
    for r in range(3):  # every cell once per repeat, repeats never interleave
        chunk = first[r * cells:(r + 1) * cells]
        assert all(i.endswith(f"-r{r}") for i in chunk) and len(set(chunk)) == cells
    assert first[:cells] != sorted(first[:cells]) or first[cells:2 * cells] != sorted(
        first[cells:2 * cells])


# ---------------------------------------------------------------- end to end


def test_ratio_of_a_missed_target_is_infinite_never_faster():
    from syncbench.bench.experiment.aggregate import scenario_cells

    def rec(label, repeat, ttt, diverged=False):
        return {"label": label, "condition": "hom", "repeat": repeat, "time_to_target_s": ttt,
                "diverged": diverged, "samples_per_s": 100.0, "final_accuracy": 0.9,
                "wall_s": 1.0, "realised_factor": math.nan, "interference_ratio": math.nan,
                "hidden_comm_fraction": math.nan}

    records = [rec("base", 0, 2.0), rec("base", 1, 2.0), rec("base", 2, 2.0),
               rec("x", 0, 1.0), rec("x", 1, math.nan), rec("x", 2, 0.5, diverged=True)]
    cells = {c["label"]: c for c in scenario_cells(records, ["base", "x"], ["hom"], "base")}
    x = cells["x"]["ttt_ratio"]
    # 0.5 (faster), inf (missed), inf (diverged, although its time was shorter)
    assert x["median"] == math.inf and x["min"] == 0.5 and x["status"] == "diverged"
    assert cells["x"]["sps_ratio"]["n"] == 2  # the diverged run's samples/s are left out


def _cell(label, group=None, ttt=1.0, sps=100.0, factor=4.0, interference=1.0, runs=5):
    def stats(v):
        return {"median": v, "min": v, "max": v, "n": runs}

    return {"condition": "s", "label": label, "group": group or label, "runs": runs,
            "diverged": 0, "reached": runs, "overlapped": 0,
            "time_to_target_s": stats(ttt), "samples_per_s": stats(sps),
            "final_accuracy": stats(0.85), "wall_s": stats(1.0),
            "realised_factor": stats(factor), "interference_ratio": stats(interference),
            "hidden_comm_fraction": stats(None), "buckets": stats(None),
            "ttt_ratio": {**stats(1.0), "status": None}, "sps_ratio": {**stats(1.0),
                                                                       "status": None},
            "het_hom": {**stats(0.6), "status": None}}


def test_hetero_table_labels_oversubscription_and_flags_unfair_stragglers():
    from syncbench.bench.experiment.print_tables import hetero_table

    ctx = {"cores": 2, "cpus": 2, "world_size": 4, "hosts": 1, "ranks_per_host": 4,
           "ranks_per_core": 2.0, "oversubscribed": True, "slowdown_mode": "work"}
    cells = [_cell("ssgd", factor=4.0), _cell("oscars", factor=5.0, interference=0.9)]
    lines = hetero_table("s", "slowdown 1,1,1,4", cells, 0.8125, 4.0,
                         {"min": 4.0, "max": 5.0, "flag": True}, [ctx] * 2)
    assert lines[0].startswith("machine: ") and "oversubscribed" in lines[0]
    assert "OVERSUBSCRIBED" in lines[1] and "ceiling sum(1/f)/N = 0.812" in lines[1]
    text = "\n".join(lines)
    assert "not a clean comparison" in text
    assert "off the nominal 4: oscars" in text and "from 1 " in text
    assert "differ by more than 10% (4.00–5.00)" in text
    quiet = hetero_table("s", "t", [_cell("ssgd")], 0.625, 4.0, {"flag": False},
                         [{**ctx, "oversubscribed": False, "world_size": 2}])
    assert not any(line.startswith("  !") for line in quiet)
    assert "OVERSUBSCRIBED" not in "\n".join(quiet)


def test_best_lr_of_a_grid_is_marked_by_time_to_target():
    from syncbench.bench.experiment.aggregate import mark_best

    cells = [_cell("od@lr=0.01", "od", ttt=3.0), _cell("od@lr=0.02", "od", ttt=2.0),
             _cell("od@lr=0.05", "od", ttt=math.inf), _cell("ssgd", ttt=9.0)]
    mark_best(cells)
    assert [c["best_lr"] for c in cells] == [False, True, False, False]
    cells[0]["samples_per_s"]["median"] = 500.0
    mark_best(cells, "samples_per_s")
    assert [c["best_lr"] for c in cells] == [True, False, False, False]


def test_a_diverged_baseline_gives_no_ratio_and_a_diverged_label_says_so():
    from syncbench.bench.experiment.aggregate import scenario_cells

    def rec(label, repeat, diverged):
        return {"label": label, "condition": "hom", "repeat": repeat,
                "time_to_target_s": math.nan if diverged else 1.0, "diverged": diverged,
                "samples_per_s": 100.0, "final_accuracy": 0.1 if diverged else 0.9,
                "wall_s": 1.0, "realised_factor": math.nan, "interference_ratio": math.nan,
                "hidden_comm_fraction": math.nan}

    records = [rec(lab, r, lab != "ok") for lab in ("base", "ok", "bad") for r in (0, 1)]
    cells = {c["label"]: c for c in scenario_cells(records, ["base", "ok", "bad"], ["hom"], "base")}
    assert cells["base"]["ttt_ratio"]["status"] == "diverged"
    assert cells["bad"]["ttt_ratio"]["status"] == "diverged"
    assert cells["bad"]["sps_ratio"]["status"] == "diverged"
    assert cells["ok"]["ttt_ratio"]["status"] == "-"  # nothing to compare against
    records = [{**r, "diverged": False} if r["label"] == "base" else r for r in records]
    cells = {c["label"]: c for c in scenario_cells(records, ["base", "ok"], ["hom"], "base")}
    assert cells["base"]["ttt_ratio"]["status"] == "not reached"  # NaN time, not diverged
    assert cells["ok"]["sps_ratio"]["median"] == 1.0


def _record(label, repeat, sps, diverged=False, overlapped=False, ttt=1.0):
    return {"label": label, "condition": "hom", "repeat": repeat,
            "time_to_target_s": math.nan if diverged else ttt, "diverged": diverged,
            "samples_per_s": sps, "final_accuracy": 0.1 if diverged else 0.9, "wall_s": 1.0,
            "realised_factor": math.nan, "interference_ratio": math.nan,
            "hidden_comm_fraction": 0.5, "overlapped": overlapped}


def test_a_diverged_run_never_makes_a_label_look_faster():
    from syncbench.analysis.repeats import format_spread as fmt_spread
    from syncbench.bench.experiment.aggregate import scenario_cells

    records = [_record("base", r, 100.0) for r in range(3)]
    records += [_record("x", 0, 900.0, diverged=True), _record("x", 1, 110.0),
                _record("x", 2, 120.0)]
    records += [_record("bad", r, 900.0, diverged=True) for r in range(3)]
    cells = {c["label"]: c for c in scenario_cells(records, ["base", "x", "bad"], ["hom"], "base")}
    assert cells["x"]["samples_per_s"]["median"] == pytest.approx(115.0)
    assert cells["x"]["samples_per_s"]["max"] == 120.0 and cells["x"]["samples_per_s"]["n"] == 2
    assert cells["x"]["hidden_comm_fraction"]["n"] == 2
    assert fmt_spread(cells["bad"]["samples_per_s"], 0) == "diverged"
    assert fmt_spread(cells["bad"]["hidden_comm_fraction"]) == "diverged"


def test_an_lr_grid_is_not_won_by_a_diverged_runs_throughput():
    from syncbench.bench.experiment.aggregate import scenario_cells

    # equal time to target; lr 0.1's samples/s median would win only with its diverged run
    records = [{**_record("g@lr=0.1", r, s, diverged=d), "time_to_target_s": 1.0}
               for r, (s, d) in enumerate(((900.0, True), (900.0, True), (100.0, False)))]
    records += [_record("g@lr=0.2", r, 200.0) for r in range(3)]
    cells = scenario_cells(records, ["g@lr=0.1", "g@lr=0.2"], ["hom"], "g@lr=0.2",
                      groups={"g@lr=0.1": "g", "g@lr=0.2": "g"}, headline="samples_per_s")
    assert [c["best_lr"] for c in cells] == [False, True]


def test_an_overlapped_baseline_run_gives_no_ratio_for_its_repeat():
    from syncbench.bench.experiment.aggregate import scenario_cells

    records = [_record("base", 0, 50.0, overlapped=True), _record("base", 1, 100.0),
               _record("x", 0, 100.0), _record("x", 1, 150.0)]
    (_, x) = scenario_cells(records, ["base", "x"], ["hom"], "base")
    assert x["sps_ratio"]["n"] == 1 and x["sps_ratio"]["median"] == 1.5
    assert x["ttt_ratio"]["n"] == 1


def test_comparison_table_shows_sync_share_eval_interval_and_the_lr_caveat():
    from syncbench.bench.experiment.print_tables import comparison_table

    def stats(v):
        return {"median": v, "min": v, "max": v, "n": 5}

    cells = [_cell("od@lr=0.01", "od"), _cell("od@lr=0.02", "od")]
    cells[1]["best_lr"] = True
    for c in cells:
        c["sync_fraction"], c["eval_interval_s"] = stats(0.25), stats(0.5)
    cells[0]["loaded"], cells[0]["foreign_cpu_share"] = 2, 0.4
    lines = comparison_table("s", "t", cells, "od@lr=0.01", 0.8, "time_to_target", [{}])
    header = lines[2]
    assert header.index("sync share") < header.index("time to 0.8 [s]") \
        < header.index("eval every [s]")
    row = next(ln for ln in lines if ln.startswith("  od@lr=0.02"))
    assert "0.25" in row and "0.50" in row
    text = "\n".join(lines)
    assert "chosen on the same repeats it is reported on" in text
    assert "od@lr=0.01: 2 run(s) loaded: other processes used 40% of the cores during the run" \
        in text


# ---------------------------------------------------------------- what a dry run checks


def test_several_rank_counts_plan_every_cell_at_each_and_keep_them_apart(tmp_path, capsys):
    """``--np 2,4`` (run, compare): every (label, configuration) at each count, the
    slowdowns resolved per count, run ids and cells keyed by the count; the ratios to the
    baseline and to the homogeneous runs are taken within one count. One count plans what
    it always did (``hom``, not ``hom-np2``)."""
    from syncbench.bench.cli import main
    from syncbench.bench.experiment.runner import plan_cells

    scenario = parse_scenario(scenario_data(slowdowns=["last:4"]), "s", "s")
    plan = plan_runs(scenario, [2, 4], 1, 0, tmp_path, [], 0.8, check=False)
    assert sorted((p.np, p.run_id) for p in plan) == [
        (2, "a-hom-np2-r0"), (2, "a-s1-4-np2-r0"), (2, "b-hom-np2-r0"), (2, "b-s1-4-np2-r0"),
        (4, "a-hom-np4-r0"), (4, "a-s1-1-1-4-np4-r0"), (4, "b-hom-np4-r0"),
        (4, "b-s1-1-1-4-np4-r0")]
    assert {p.condition.title for p in plan if p.np == 4} == {
        "homogeneous, 4 ranks", "slowdown 1,1,1,4, 4 ranks"}
    assert {p.condition.title for p in plan_runs(scenario, [1, 2], 1, 0, tmp_path, [], 0.8,
                                                 check=False) if p.np == 1} == {
        "homogeneous, 1 rank", "slowdown 4, 1 rank"}
    single = plan_runs(scenario, [2], 1, 0, tmp_path, [], 0.8, check=False)
    assert [p.run_id for p in single] == [p.run_id for p in plan_runs(
        scenario, 2, 1, 0, tmp_path, [], 0.8, check=False)]
    assert {p.condition.key for p in single} == {"hom", "s1-4"}
    # b is twice a's speed at 2 ranks and three times at 4; slowed runs at half speed
    speed = {("a", 2): 100.0, ("b", 2): 200.0, ("a", 4): 100.0, ("b", 4): 300.0}
    records = [{**_record(p.entry.label, 0, speed[(p.entry.label, p.np)]
                          / (1 if p.condition.homogeneous else 2)),
                "condition": p.condition.key, "np": p.np} for p in plan]
    cells = {(c["condition"], c["label"]): c for c in plan_cells(scenario, plan, records)}
    assert len(cells) == 8
    assert cells[("hom-np2", "b")]["sps_ratio"]["median"] == 2.0
    assert cells[("hom-np4", "b")]["sps_ratio"]["median"] == 3.0
    assert cells[("s1-1-1-4-np4", "b")]["sps_ratio"]["median"] == 3.0
    assert cells[("s1-4-np2", "a")]["het_hom"]["median"] == 0.5
    assert cells[("hom-np4", "a")]["samples_per_s"]["n"] == 1
    # the dry run shows the launch of every run, at its count
    out = tmp_path / "out"
    assert main(["compare", "--np", "2,4", "--algorithms", "ssgd,localsgd", "--dry-run",
                 "--order-seed", "1", "--dataset", "synthetic", "--out-dir", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert sorted((line.split(" -n ")[1].split()[0], line.split("--out ")[1].split()[0])
                  for line in lines) == [
        ("2", str(out / "localsgd-hom-np2-r0.h5")), ("2", str(out / "ssgd-hom-np2-r0.h5")),
        ("4", str(out / "localsgd-hom-np4-r0.h5")), ("4", str(out / "ssgd-hom-np4-r0.h5"))]


@pytest.mark.parametrize("command", [["run", "demo"], ["compare"], ["sweep"], ["peers"]])
@pytest.mark.parametrize("value, message", [
    ("2,x", "expected positive integers like 4 or 1,2,4, got '2,x'"),
    ("0", "expected positive integers like 4 or 1,2,4, got '0'"),
    ("2,2", "rank counts repeat in '2,2'")])
def test_np_is_one_rank_count_list_for_every_command(command, value, message, capsys):
    """run, compare, sweep and peers read ``--np`` with one parser (flags.rank_counts): a
    single count or a list, the same one line for a bad one."""
    from syncbench.bench.cli import build_parser, mpi_not_started

    with mpi_not_started():
        parser = build_parser(command[0])
    assert parser.parse_known_args([*command, "--np", "4"])[0].np == [4]
    assert parser.parse_known_args([*command, "--np", "2,4"])[0].np == [2, 4]
    with pytest.raises(SystemExit) as exc:
        parser.parse_known_args([*command, "--np", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"syncbench {command[0]}: error: argument --np: {message}" in err


def test_a_configurations_node_speeds_are_relative_to_the_clusters(monkeypatch):
    """On a cluster brought up with every node at 0.5 (two nodes to a core), the
    homogeneous configuration keeps them at 0.5 and ``last:0.5`` puts the last at 0.25;
    the end restores what was found."""
    from types import SimpleNamespace

    from syncbench.bench.cluster.state import Cluster, Node
    from syncbench.bench.experiment import on_cluster

    nodes = [Node(index=i, name=f"n{i}", address=f"10.0.0.{i}", veth=f"v{i}", cpus="0",
                  speed=0.5, up_speed=0.5) for i in (1, 2, 3, 4)]
    nodes[3].speed = 0.25  # left by a run killed during a slow configuration
    monkeypatch.setattr(on_cluster, "load", lambda: Cluster(nodes=nodes))
    calls = []
    monkeypatch.setattr(on_cluster, "set_speeds", calls.append)
    before, restore = on_cluster.speed_setter()
    before(SimpleNamespace(condition=SimpleNamespace(speeds=None)))
    before(SimpleNamespace(condition=SimpleNamespace(speeds=(1.0, 1.0, 1.0, 0.5))))
    restore()
    # relative to the speeds at up, not to the 0.25 the killed run left; restored as found
    assert calls == [{"n1": 0.5, "n2": 0.5, "n3": 0.5, "n4": 0.5},
                     {"n1": 0.5, "n2": 0.5, "n3": 0.5, "n4": 0.25},
                     {"n1": 0.5, "n2": 0.5, "n3": 0.5, "n4": 0.25}]
    tiny = SimpleNamespace(condition=SimpleNamespace(speeds=(1.0, 1.0, 1.0, 0.01)))
    import pytest

    from syncbench.bench.cluster.host import ClusterError
    with pytest.raises(ClusterError, match=r"0\.01 x the speed it was brought up with "
                       r"\(0\.5\) is 0\.005"):
        on_cluster.speed_setter([tiny])
