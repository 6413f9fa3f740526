"""The experiment runner (``syncbench run``): scenarios, plans, and one real tiny scenario.

The end-to-end test launches real ``mpiexec -n 2 syncbench train`` runs on the
synthetic dataset (a few seconds each) and checks the results file against a
recomputation from the run files it names.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from syncbench.analysis.runfile import read_run
from syncbench.bench.experiment.plan import plan_runs
from syncbench.bench.experiment.results_paths import read_results
from syncbench.bench.experiment.scenario import (
    ScenarioError,
    load_scenario,
    parse_scenario,
    shipped_scenarios,
)

SHIPPED = ("demo", "hetero", "overlap", "asgd", "peers", "cluster-overlap", "cluster-hetero")

TINY = """
description = "tiny: ssgd against a diverging ssgd, with a 2x slower last rank"
np = 2
repeats = 2
target_accuracy = 0.5
eval_every = 0.25
slowdowns = ["last:2"]
flags = { dataset = "synthetic", synthetic_samples = 1024, epochs = 1, batch_size = 32 }

[[run]]
label = "ssgd"
algorithm = "ssgd"

[[run]]
label = "wild"
algorithm = "ssgd"
flags = { lr = 50 }
"""


def syncbench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "syncbench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


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
        plan = plan_runs(scenario, scenario.np, 1, 0, Path("/tmp/x"), [],
                         scenario.target_accuracy)
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


def test_a_node_speed_scenario_needs_the_cluster_and_its_layout(tmp_path, monkeypatch):
    """Without --cluster a node-speed scenario is refused; with it, the cluster that is up
    must have the scenario's nodes and link rate (one line naming the command)."""
    no_cluster = syncbench("run", "cluster-hetero", "--dry-run")
    assert no_cluster.returncode == 2 and "--cluster" in no_cluster.stderr
    assert no_cluster.stderr.count("\n") == 1
    from syncbench.bench.cluster import state
    from syncbench.bench.experiment.on_cluster import layout_problem

    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(tmp_path))
    sc = load_scenario("cluster-overlap")
    assert "no emulated cluster is up" in layout_problem(sc, 2)
    nodes = [state.Node(i, f"n{i}", f"10.0.0.{i}", f"v{i}") for i in (1, 2)]
    state.save(state.Cluster(nodes=nodes, link="1gbit"))
    assert layout_problem(sc, 2) is None
    assert "needs 4 emulated nodes, the cluster that is up has 2" in layout_problem(sc, 4)
    assert "syncbench cluster up --nodes 4 --link 1gbit" in layout_problem(sc, 4)
    nodes[1].link = "200mbit"  # changed live by `syncbench cluster link`
    state.save(state.Cluster(nodes=nodes, link="1gbit"))
    assert "written for 1gbit links, the cluster has n2 200mbit" in layout_problem(sc, 2)


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


@pytest.mark.parametrize("text, message", [
    ("np = [", "not valid TOML"),
    ("np = 2\n[[run]]\nlabel = 'a'\nalgorithm = 'ssgd'\nflags = { nosuch_flag = 1 }\n",
     "syncbench train does not know --nosuch-flag"),
    ("np = 2\n[[run]]\nalgorithm = 'ssgd'\nflags = { comm = 'sideways' }\n",
     "invalid choice: 'sideways'"),
    # train takes no abbreviation: --ou is not --out, --see not --seed (the runner's)
    ("np = 2\nflags = { ou = '/tmp/x.h5' }\n[[run]]\nalgorithm = 'ssgd'\n",
     "scenario bad: run 'ssgd' (homogeneous): syncbench train does not know --ou /tmp/x.h5"),
    ("np = 2\n[[run]]\nalgorithm = 'ssgd'\nflags = { see = 3 }\n",
     "scenario bad: run 'ssgd' (homogeneous): syncbench train does not know --see 3"),
    ("np = [1, 2]\nflags = { ou = '/tmp/x.h5' }\n[[run]]\nalgorithm = 'ssgd'\n",
     "scenario bad: run 'ssgd' (np 1): syncbench train does not know --ou /tmp/x.h5"),
    # a file every run writes goes into the out-dir: a bare name only
    ("np = 2\nflags = { save_model = '/tmp/x' }\n[[run]]\nalgorithm = 'ssgd'\n",
     "bad.toml: flags: 'save_model' = '/tmp/x' must be a file name"),
    ("np = 2\n[[run]]\nalgorithm = 'ssgd'\nflags = { save-model = '../x.npy' }\n",
     "bad.toml: [[run]] 'ssgd' flags: 'save-model' = '../x.npy' must be a file name"),
    ("np = [1, 2]\n[[run]]\nalgorithm = 'ssgd'\nflags = { save_model = 'd/x.npy' }\n",
     "'save_model' = 'd/x.npy' must be a file name"),
])
def test_bad_scenario_file_exits_2_with_one_line_and_writes_nothing(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "out"
    proc = syncbench("run", str(path), "--out-dir", str(out), timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench run: error: ")
    assert message in lines[0]
    assert not out.exists() and proc.stdout == ""


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


def test_missing_scenario_and_reserved_passthrough_flags_are_errors(tmp_path):
    proc = syncbench("run", str(tmp_path / "nope.toml"), timeout=60)
    assert proc.returncode == 2 and "no such scenario file" in proc.stderr
    assert "shipped scenarios: " in proc.stderr
    proc = syncbench("run", "demo", "--dry-run", "--algorithm", "asgd", timeout=60)
    assert proc.returncode == 2 and "--algorithm is set by the runner" in proc.stderr


def test_help_lists_the_shipped_scenarios_and_aliases_still_answer():
    proc = syncbench("run", "--help", timeout=60)
    assert proc.returncode == 0
    for name in SHIPPED:
        assert f"\n  {name} " in proc.stdout
    for alias in ("hetero", "overlap", "asgd-bench", "compare"):
        assert syncbench(alias, "--help", timeout=60).returncode == 0


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


def test_dry_run_prints_one_launch_line_per_run_with_the_repeat_seed():
    proc = syncbench("run", "asgd", "--np", "2", "--repeats", "2", "--order-seed", "1",
                     "--dry-run", "--batch-size", "32", "--mpiexec", "launch --bind", timeout=60)
    assert proc.returncode == 0, proc.stderr
    seed, *lines = proc.stdout.strip().splitlines()
    assert seed.startswith("# seed 1: ")
    assert len(lines) == 2 * 4 * 2  # (ssgd + 3 asgd lrs) x (hom, 1,4) x 2 repeats
    # The whole launch line: the launcher, its rank count, this Python, train's flags.
    head = f"launch --bind -n 2 {sys.executable} -m syncbench train --algorithm "
    assert all(line.startswith(head) for line in lines), lines[0]
    assert all(line.count("--batch-size 32") == 1 for line in lines)  # pass-through, once
    assert sum("--seed 1 " in line for line in lines) == 8
    assert sum("--slowdown 1,4 " in line for line in lines) == 8


# ---------------------------------------------------------------- end to end


def _median(values):
    return float(np.median(np.asarray(values, dtype=np.float64)))


def _check_cell_medians(results: dict, cells: dict) -> None:
    """Every cell's medians against a recomputation from its run files (non-diverged)."""
    for (cond, label), cell in cells.items():
        runs = [read_run(r["path"]) for r in results["runs"]
                if r["condition"] == cond and r["label"] == label]
        assert len(runs) == 2
        ok = [r for r in runs if not r.summary_extra.get("diverged")]
        if not ok:  # a diverged run's samples/s are no result
            assert cell["samples_per_s"]["status"] == "diverged"
        else:
            assert cell["samples_per_s"]["median"] == pytest.approx(
                _median([r.summary["samples_per_s"] for r in ok]), rel=1e-12)
            assert cell["samples_per_s"]["min"] == pytest.approx(
                min(r.summary["samples_per_s"] for r in ok), rel=1e-12)
        assert cell["final_accuracy"]["median"] == pytest.approx(
            _median([r.summary["final_accuracy"] for r in runs]), rel=1e-12)


def test_tiny_scenario_end_to_end(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    out = tmp_path / "runs"
    plots = tmp_path / "plots"
    proc = syncbench("run", str(scenario), "--out-dir", str(out), "--order-seed", "5",
                     "--plots", str(plots), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out / "results.json")  # run-file paths resolved
    assert results["complete"] and results["seed"] == 5
    assert results["schema"] == "syncbench-results/1"

    # the recorded order is the seeded plan, and every run file exists
    plan = plan_runs(load_scenario(str(scenario)), 2, 2, 5, out, [], 0.5, check=False)
    assert results["order"] == [p.run_id for p in plan]
    assert len(results["runs"]) == 8 and all(Path(r["path"]).is_file() for r in results["runs"])
    assert "cores" in results["machine"] and results["machine_line"].startswith("machine: ")

    # medians in the results file match a recomputation from the run files
    cells = {(c["condition"], c["label"]): c for c in results["cells"]}
    assert set(cells) == {(c, lab) for c in ("hom", "s1-2") for lab in ("ssgd", "wild")}
    _check_cell_medians(results, cells)
    ssgd_runs = {r["repeat"]: read_run(r["path"]) for r in results["runs"]
                 if r["condition"] == "s1-2" and r["label"] == "ssgd"}
    hom_runs = {r["repeat"]: read_run(r["path"]) for r in results["runs"]
                if r["condition"] == "hom" and r["label"] == "ssgd"}
    het_hom = [ssgd_runs[k].summary["samples_per_s"] / hom_runs[k].summary["samples_per_s"]
               for k in (0, 1)]
    assert cells[("s1-2", "ssgd")]["het_hom"]["median"] == pytest.approx(_median(het_hom))
    assert cells[("hom", "ssgd")]["ttt_ratio"]["median"] == 1.0
    assert results["comparisons"][0]["ceiling"] == pytest.approx(0.75)

    # the run at lr 50 diverged: "diverged" in every table, never faster
    for cond in ("hom", "s1-2"):
        wild = cells[(cond, "wild")]
        assert wild["diverged"] == 2
        assert wild["ttt_ratio"]["status"] == "diverged"
        assert wild["sps_ratio"]["status"] == "diverged"
        assert wild["ttt_ratio"]["median"] is None or wild["ttt_ratio"]["median"] >= 1
    assert cells[("s1-2", "wild")]["het_hom"]["status"] == "diverged"
    assert {c["samples_per_s"]["status"] for k, c in cells.items() if k[1] == "wild"} \
        == {"diverged"}
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  wild")]
    assert len(rows) == 3  # two comparison tables and the heterogeneous table
    assert all("diverged" in row for row in rows)
    head = [line for line in proc.stdout.splitlines() if line.startswith("# label")]
    assert head and all("to 0.5 / ssgd" in h for h in head[:2])
    assert all("sync share" in h and "eval every [s]" in h for h in head[:2])
    assert all(r["sync_fraction"] is not None and r["loaded"] in (True, False)
               for r in results["runs"])  # recorded load average: flag known
    # a machine-context line above every table
    lines = proc.stdout.splitlines()
    titles = [i for i, line in enumerate(lines) if line.startswith("# tiny: ")]
    assert len(titles) == 3 and all(lines[i - 1].startswith("machine: ") for i in titles)
    # it ends with where the files are and the next two commands; --plots wrote the plots
    tail = proc.stdout.strip().splitlines()[-4:]
    assert tail[0].startswith(f"run files: {out}/ (8 files); results: ")
    assert tail[1] == "next:"
    assert f"syncbench report {out}/*.h5 --plots {plots}" in tail[2]
    assert "syncbench trace " in tail[3] and "ssgd-hom-r0.h5" in tail[3]
    assert sorted(p.suffix for p in plots.iterdir()) and any(plots.glob("*.pdf"))

    # --resume keeps every finished run and rewrites the same results
    again = syncbench("run", str(scenario), "--out-dir", str(out), "--resume", timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("kept by --resume") == 8
    assert json.loads((out / "results.json").read_text())["order"] == results["order"]


def test_make_demo_runs_the_demo_scenario_with_plots_in_runs_plots():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["make", "-n", "demo"], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "syncbench run demo" in proc.stdout and "--plots runs/plots" in proc.stdout


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


def test_resume_refuses_a_folder_without_or_with_another_plan(tmp_path):
    proc = syncbench("run", "demo", "--resume", "--out-dir", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    (tmp_path / "results.json").write_text(json.dumps({"seed": 1, "plan": []}))
    proc = syncbench("run", "demo", "--resume", "--out-dir", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "written for another plan" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


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


def _launch_lines(proc: subprocess.CompletedProcess) -> tuple[int, list[str]]:
    """(the order seed a dry run names on its first line, its launch lines)."""
    assert proc.returncode == 0, proc.stderr
    first, *lines = proc.stdout.strip().splitlines()
    assert first.startswith("# seed "), first
    return int(first.split()[2].rstrip(":")), lines


def test_a_dry_run_names_the_seed_whose_order_it_prints(tmp_path):
    """Without a seed the dry run draws one and says which; that seed plans that order."""
    common = ("run", "hetero", "--np", "2", "--repeats", "2", "--dataset", "synthetic",
              "--dry-run", "--out-dir", str(tmp_path / "runs"))
    seed, lines = _launch_lines(syncbench(*common, timeout=60))
    again, same = _launch_lines(syncbench(*common, "--order-seed", str(seed), timeout=60))
    assert again == seed and same == lines
    scenario = load_scenario("hetero")
    plan = plan_runs(scenario, 2, 2, seed, tmp_path / "runs", ["--dataset", "synthetic"],
                     scenario.target_accuracy, check=False)
    assert [line.split("--out ")[1].split()[0] for line in lines] == [str(p.path)
                                                                      for p in plan]
    assert not (tmp_path / "runs").exists()


def test_an_unknown_compare_algorithm_is_an_error_naming_the_known_ones(tmp_path):
    proc = syncbench("compare", "--algorithms", "ssgd,ossgd", "--dry-run", "--out-dir",
                     str(tmp_path / "c"), timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    from syncbench.algorithms.registry import ALGORITHMS

    shipped = [n for n, c in ALGORITHMS.items() if c.__module__.startswith("syncbench.")]
    assert proc.stderr.strip() == (
        "syncbench compare: error: --algorithms: unknown ossgd (ossgd: did you mean ssgd?); "
        f"known: {', '.join(shipped)}")


@pytest.mark.skipif(os.path.isdir("/usr/share/datasets/mnist") or
                    bool(os.environ.get("SYNCBENCH_DATA")), reason="MNIST is present here")
def test_a_dry_run_checks_that_the_dataset_is_present(tmp_path):
    proc = syncbench("run", "demo", "--dry-run", "--dataset", "mnist", "--out-dir",
                     str(tmp_path / "runs"), timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "dataset 'mnist' not found" in lines[0], proc.stderr


def _results_of(scenario_path: Path, out: Path, seed: int, np_: int = 2) -> None:
    """A results file in ``out`` as a run of ``scenario_path`` with ``seed`` leaves it."""
    from syncbench.bench.experiment.runner import _plan_json, write_json

    scenario = load_scenario(str(scenario_path))
    plan = plan_runs(scenario, np_, scenario.repeats, seed, out, [],
                     scenario.target_accuracy, check=False)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"seed": seed, "plan": _plan_json(plan), "complete": True})


def test_an_out_dir_with_the_results_of_another_plan_is_refused(tmp_path):
    """A second comparison into the same folder would overwrite the first one's files:
    refused (dry run too) unless it is the same plan, whose seed it then reuses."""
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY)
    out = tmp_path / "runs"
    _results_of(tiny, out, seed=77)
    before = (out / "results.json").read_bytes()
    seed, _ = _launch_lines(syncbench("run", str(tiny), "--out-dir", str(out), "--dry-run",
                                      timeout=60))
    assert seed == 77  # the same plan: the recorded seed, so the same order
    other = syncbench("compare", "--algorithms", "ssgd", "--dataset", "synthetic",
                      "--out-dir", str(out), timeout=60)
    assert other.returncode == 2 and other.stdout == ""
    assert other.stderr.strip().startswith(
        f"syncbench compare: error: --out-dir {out} holds the results of another plan")
    other_seed = syncbench("run", str(tiny), "--out-dir", str(out), "--order-seed", "3",
                           "--dry-run", timeout=60)
    assert other_seed.returncode == 2 and "another plan" in other_seed.stderr
    assert (out / "results.json").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
