"""``syncbench simulate``: collectives on SimGrid, strategies' timelines, the run file: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_simulate.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from sim_helpers import needs_simgrid, python, simulate

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run


def test_without_simgrid_one_line_and_status_2():
    proc = python("""
        import sys
        sys.modules["simgrid"] = None  # import simgrid raises ImportError
        from syncbench.bench.cli import main
        sys.exit(main(["simulate", "--np", "4"]))
    """)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench simulate: error:")
    assert "make sim" in lines[0] and "syncbench[sim]" in lines[0]


@needs_simgrid
def test_ring_allreduce_matches_the_alpha_beta_formula():
    # Crossbar: a route crosses two private links, so its latency is 2 x the link's.
    proc = python("""
        import json
        from syncbench.bench.simulate.collectives import allreduce_phases, cost
        from syncbench.bench.simulate.engine import run_in_simgrid
        from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
        out = {}
        spec = PlatformSpec(kind="crossbar", bandwidth=5e9, latency=2e-6)
        def body(net):
            tp = lambda p: net.phase(p.key(), p.pairs, p.nbytes)
            for n, size in ((2, 1e6), (8, 8e6), (16, 64e3), (16, 64e6)):
                out[f"{n} {size}"] = cost(allreduce_phases(size, n, "ring"), tp)
        run_in_simgrid(platform_xml(spec, 16), body, 1, natural_key)
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    bandwidth, latency = 5e9, 4e-6
    for key, seconds in measured.items():
        n, size = int(key.split()[0]), float(key.split()[1])
        expected = 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency
        assert seconds == pytest.approx(expected, rel=0.05), key


@needs_simgrid
def test_ssgd_steps_at_the_slow_ranks_pace(tmp_path):
    out = tmp_path / "slow.h5"
    proc = simulate("--algorithm", "ssgd", "--np", "8", "--steps", "12",
                    "--slowdown", "1,1,1,1,1,1,1,4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    slow = run.ranks[7]
    slow_local = slow["t_data"] + slow["t_compute"] + slow["t_delay"]
    assert np.mean(slow["t_delay"]) == pytest.approx(3 * np.mean(slow["t_compute"]), rel=1e-6)
    # The run lasts at least the slow rank's local work, and every rank steps at its pace
    # (the slow rank spends its delay right before it posts its last bucket, as in
    # train, so the fast ranks wait for it in the same step).
    assert run.summary["wall_s"] >= float(np.sum(slow_local))
    slow_step = np.mean(np.diff(slow["t_start"]))
    assert slow_step >= np.mean(slow_local)
    for rank in range(7):
        cols = run.ranks[rank]
        assert np.mean(np.diff(cols["t_start"])[1:]) == pytest.approx(slow_step, rel=0.05)
        own = cols["t_data"] + cols["t_compute"] + cols["t_delay"]
        # the difference is waiting for the slow rank
        assert np.mean(cols["t_wait"][1:]) > 0.8 * np.mean(slow_local - own)
    assert np.mean(slow["t_wait"]) < 0.2 * np.mean(run.ranks[0]["t_wait"])


@needs_simgrid
def test_a_node_that_runs_in_bursts_is_slower_than_its_nominal_share(tmp_path):
    """--node-throttle 3.3/4.7 (near what the emulated cluster measures at speed 0.5): a Local
    SGD rank that computes through most steps realises about 3.3 / 8 of the CPU, not
    half of it, and the run file says so; a rank without a quota keeps all of it. A
    blocking SSGD rank's waits poll (--node-wait-cpu's default, 1) and give its quota no
    rest; one that slept through them (--node-wait-cpu 0) would get credit back in each,
    realise more and finish sooner."""
    runs = {}
    blocking = ["--algorithm", "ssgd", "--comm", "blocking", "--node-throttle", "3.3/4.7"]
    for name, flags in (("even", []), ("bursts", ["--node-throttle", "3.3/4.7"]),
                        ("polling", blocking), ("resting", [*blocking, "--node-wait-cpu", "0"])):
        out = tmp_path / f"{name}.h5"
        proc = simulate("--algorithm", "localsgd", "--np", "2", "--steps", "40",
                        "--node-speed", "1,0.5", *flags, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        runs[name] = read_run(out)
    slower = runs["bursts"].summary["samples_per_s"] / runs["even"].summary["samples_per_s"]
    assert 0.75 < slower < 0.95
    realised = json.loads(runs["bursts"].attrs["simulation"])["realised_node_speed"]
    assert realised[0] == 1.0 and 0.40 < realised[1] < 0.46, realised
    assert "realised_node_speed" not in json.loads(runs["even"].attrs["simulation"])
    shares = {name: json.loads(runs[name].attrs["simulation"])["realised_node_speed"][1]
              for name in ("polling", "resting")}
    assert shares["resting"] > shares["polling"] + 0.005, shares
    assert (runs["resting"].summary["samples_per_s"]
            > runs["polling"].summary["samples_per_s"])


@needs_simgrid
def test_oscars_local_steps_are_schedules_output(tmp_path):
    from syncbench.algorithms.averagers.schedule import fit_budget, schedule, uniform_schedule

    out = tmp_path / "oscars.h5"
    proc = simulate("--algorithm", "oscars", "--np", "4", "--steps", "40", "--period", "4",
                    "--slowdown", "1,1,2,3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    n, total = 4, 40 * 4
    rounds = int(max(c["round"].max() for c in run.ranks.values())) + 1
    assert rounds >= 3
    remaining = total
    for r in range(rounds):
        first = [np.flatnonzero(run.ranks[k]["round"] == r) for k in range(n)]
        taus = [len(idx) for idx in first]
        speeds = [float(run.ranks[k]["speed"][first[k][0]]) for k in range(n)]
        plan = uniform_schedule(n, 4, 32) if r == 0 else schedule(speeds, 4, 32)
        assert taus == fit_budget(plan, remaining), f"round {r}"
        assert all(int(run.ranks[k]["local_steps"][first[k][0]]) == taus[k] for k in range(n))
        remaining -= sum(taus)
    assert remaining == 0
    # The slower the rank, the fewer its local steps after the first round.
    later = [int(np.sum(run.ranks[k]["round"] > 0)) for k in range(n)]
    assert later[0] > later[2] > later[3]


@needs_simgrid
def test_simulated_run_file_is_a_run_file(tmp_path):
    out = tmp_path / "sim.h5"
    proc = simulate("--algorithm", "asgd", "--np", "16", "--steps", "5", "--platform",
                    "dragonfly", "--stragglers", "1/4:2x", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "flows/s" in proc.stdout
    run = read_run(out)  # the same checks as a measured run
    assert run.rank_layout == schema.RANK_LAYOUT_PACKED  # the recorder's writer's layout
    assert run.attrs[schema.SIMULATED_ATTR] is True
    assert json.loads(run.attrs[schema.SIM_PLATFORM_ATTR])["kind"] == "dragonfly"
    assert json.loads(run.attrs[schema.SIM_WORKLOAD_ATTR])["params"] == 235146
    assert run.world_size == 16 and sorted(run.ranks) == list(range(16))
    assert sum(len(c["step"]) for c in run.ranks.values()) == 5 * 16  # the global budget
    for cols in run.ranks.values():
        assert set(cols) == set(schema.RANK_COLUMNS)
        assert np.all(np.diff(cols["t_start"]) > 0)
    assert len(run.eval["t"]) == 0 and math.isnan(run.summary["final_accuracy"])
    assert run.summary["samples_per_s"] > 0
    assert run.summary_extra.get("diverged") is False
    report = subprocess.run([sys.executable, "-m", "syncbench", "report", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    trace = subprocess.run([sys.executable, "-m", "syncbench", "trace", str(out), "-o",
                            str(tmp_path / "t.json")], capture_output=True, text=True,
                           timeout=120)
    assert trace.returncode == 0, trace.stderr


@needs_simgrid
@pytest.mark.parametrize("algorithm", ["ssgd", "localsgd", "odsgd", "oscars", "asgd"])
def test_every_strategy_on_a_torus_with_stragglers(algorithm, tmp_path):
    out = tmp_path / f"{algorithm}.h5"
    proc = simulate("--algorithm", algorithm, "--np", "32", "--steps", "8", "--platform",
                    "torus", "--stragglers", "1/8:lognormal:1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert run.algorithm == algorithm
    assert run.summary["wall_s"] > 0 and 0 <= run.summary["wait_fraction"] < 1


@needs_simgrid
def test_bad_input_is_one_line_and_status_2(tmp_path):
    for flags in (["--np", "0"], ["--workload", "nosuch"], ["--stragglers", "x"],
                  ["--slowdown", "1,2", "--np", "4"], ["--workload", str(tmp_path / "no.h5")],
                  ["--np", "2", "--node-speed", "1,0.5", "--node-throttle", "3/5",
                   "--node-wait-cpu", "2"], ["--np", "2", "--node-wait-cpu", "0.5"]):
        proc = simulate(*flags, "--out", str(tmp_path / "x.h5"))
        assert proc.returncode == 2, flags
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("syncbench simulate: error:"), flags
        assert not (tmp_path / "x.h5").exists()


@needs_simgrid
def test_np_outside_the_simulated_range_is_one_line_at_once(tmp_path):
    proc = simulate("--np", "100000", "--steps", "1", "--out", str(tmp_path / "x.h5"),
                    timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("syncbench simulate: error: --np 100000 is outside "
                                   "1..16384 (the simulated ranks)")
    assert not (tmp_path / "x.h5").exists()


@needs_simgrid
@pytest.mark.slow
def test_sweep_simulate_writes_a_scaling_series(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "syncbench", "sweep", "--simulate", "--mode", "weak", "--np",
         "4,16", "--algorithms", "ssgd,oscars", "--out-dir", str(tmp_path), "--steps", "4",
         "--platform", "fat-tree"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for algorithm in ("ssgd", "oscars"):
        for n in (4, 16):
            run = read_run(tmp_path / f"{algorithm}-weak-np{n}-r0.h5")
            assert run.attrs[schema.SIMULATED_ATTR] is True and run.world_size == n
            assert run.attrs["scaling_mode"] == "weak"
            assert all(len(c["step"]) == 4 for c in run.ranks.values()) or algorithm == "oscars"
    # one series per algorithm: the 16-rank point has an efficiency, not "-"
    cells = [[c.strip() for c in ln.split("|")] for ln in proc.stdout.splitlines()
             if ln.startswith("| ssgd")]
    points = [c for c in cells if len(c) > 8 and c[2] == "16"]
    assert points and float(points[-1][8]) > 0  # efficiency vs the 4-rank point


@needs_simgrid
@pytest.mark.slow
def test_validate_prints_measured_and_predicted(tmp_path):
    from helpers import run_mpi

    data = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--eval-every", "0",
            "--progress", "never"]
    work, run, comm = tmp_path / "work.h5", tmp_path / "run.h5", tmp_path / "comm.h5"
    for np_, out in ((1, work), (2, run)):
        proc = run_mpi(np_, "train", "--algorithm", "ssgd", *data, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
    proc = run_mpi(2, "comm", "--op", "allreduce", "--min-size", "1024", "--max-size",
                   "1048576", "--iterations", "10", "--skip", "2", "--out", str(comm))
    assert proc.returncode == 0, proc.stderr
    table = tmp_path / "validation.csv"
    proc = simulate("--validate", str(run), "--workload", str(work), "--calibrate", str(comm),
                    "--validate-csv", str(table))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(ln.split() for ln in lines if ln.startswith("run "))
    row = [ln.split() for ln in lines if ln.startswith("run.h5")]
    assert len(row) == 1 and row[0][1] == "ssgd" and row[0][2] == "2"
    measured = float(row[0][head.index("meas/s")])
    predicted = float(row[0][head.index("pred/s")])
    error = float(row[0][head.index("err")].rstrip("%"))
    assert measured > 0 and predicted > 0
    assert error == pytest.approx(100 * (predicted / measured - 1), abs=1.0)
    assert "calibrated from" in proc.stdout and "mean |error|" in proc.stdout
    from syncbench.bench.simulate.validate_pool import read_table

    (kept,) = read_table(str(table))  # the row printed, kept
    assert kept.run == str(run) and kept.label and kept.configuration == "hom"
    assert kept.measured == pytest.approx(measured, abs=1) and \
        kept.predicted == pytest.approx(predicted, abs=1)
    pooled = simulate("--validate-pool", str(table))
    assert pooled.returncode == 0 and "1 runs from 1 tables" in pooled.stdout


def test_validate_measures_samples_per_s_on_the_clock_of_wall_s(tmp_path):
    """Evaluation pauses sit inside the rows' span but not in wall_s: the measured rate is
    the run's own samples_per_s, not samples over the span (which reads it far lower)."""
    from helpers import run_mpi

    from syncbench.bench.simulate.validate import measured_samples_per_s, row_figures

    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", "--algorithm", "ssgd", "--dataset", "synthetic",
                   "--synthetic-samples", "4096", "--epochs", "2", "--eval-every", "0.1",
                   "--progress", "never", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert measured_samples_per_s(run) == pytest.approx(run.summary["samples_per_s"])
    assert row_figures(run.ranks)["samples_per_s"] < 0.95 * run.summary["samples_per_s"]


@needs_simgrid
def test_a_run_whose_cpus_differed_is_predicted_at_its_slower_ranks_pace(tmp_path):
    """Blocking SSGD, homogeneous, rank 0 computing 30 ms a step and rank 1 20 ms (one
    CPU slower than the other in that run, as a KVM guest's were): every step waits for
    rank 0. The workload's ranks computed 25 ms each. ``--validate-host-speed run`` takes
    one factor for the run, the free steps' median (25 ms, half the steps at 20 and half
    at 30) over the workload's, 1, and predicts 25 ms a step: +20%. ``rank`` scales each
    rank by its own (1.2 and 0.8) and predicts the measured 30 ms: 0%."""
    from test_analysis import make_rank, write_file

    steps = 24
    ranks = {0: make_rank(steps, {"compute": 0.030}), 1: make_rank(steps, {"compute": 0.020})}
    run = write_file(tmp_path / "run.h5", algorithm="ssgd", world_size=2,
                     wall=steps * 0.0302, steps_per_rank=steps, rank_rows=ranks,
                     config={"comm": "blocking"})
    work = write_file(tmp_path / "work.h5", algorithm="localsgd", world_size=2,
                      wall=steps * 0.025, steps_per_rank=steps,
                      phases={"compute": 0.025}, config={"period": 1000000000})
    errors = {}
    for mode in ("run", "rank"):
        proc = simulate("--validate", run, "--workload", work, "--validate-host-speed", mode)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (row,) = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("run.h5")]
        errors[mode] = float(next(c for c in row if c.endswith("%")).rstrip("%"))
    assert errors["run"] > 10 and abs(errors["rank"]) < 5, errors
