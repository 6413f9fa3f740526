"""The experiment runner (``syncbench run``): scenarios, plans, and one real tiny scenario: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_runner.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_runner import SHIPPED

from syncbench.analysis.runfile import read_run
from syncbench.bench.experiment.plan import plan_runs
from syncbench.bench.experiment.results_paths import read_results
from syncbench.bench.experiment.scenario import (
    load_scenario,
)

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


@pytest.mark.slow  # 8 launched runs and a resume: 25 s of make test's budget
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
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["make", "-n", "demo"], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "syncbench run demo" in proc.stdout and "--plots runs/plots" in proc.stdout


def test_resume_refuses_a_folder_without_or_with_another_plan(tmp_path):
    proc = syncbench("run", "demo", "--resume", "--out-dir", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    (tmp_path / "results.json").write_text(json.dumps({"seed": 1, "plan": []}))
    proc = syncbench("run", "demo", "--resume", "--out-dir", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "written for another plan" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


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
