"""``syncbench sweep``: strong and weak scaling at np 1,2 with tiny synthetic runs.

The sweep launches its own ``mpiexec`` per run (serial pytest run), each
bounded by ``--run-timeout``. Invariants checked exactly against a serial
re-computation of the plan: strong scaling keeps the global batch B (per-rank
batch B / N, the same number of steps at every N), weak scaling keeps the
per-rank batch b and the budget per rank (``--epochs`` times N: the same
number of steps per rank at every N). ``syncbench run`` of the same scaling
scenario as a file keeps the sweep's run files and prints the same table.

Split off this module: ``tests/e2e/test_sweep_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
from helpers import small_ssgd_run

from syncbench.bench.commands import sweep as sweep_command
from syncbench.bench.experiment import sweep
from syncbench.bench.experiment.adhoc import sweep_scenario
from syncbench.bench.experiment.plan import plan_scaling
from syncbench.bench.experiment.results_paths import read_results
from syncbench.bench.experiment.scaling_table import _report_text
from syncbench.bench.experiment.scenario import parse_scenario


def parse(*flags: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser()
    sweep_command.add_arguments(parser)
    return parser.parse_known_args(list(flags))


def run_sweep(capsys, *flags: str) -> tuple[int, str, dict]:
    args, extra = parse(*flags, "--run-timeout", "60")
    code = sweep_command.run(args, extra)
    out = capsys.readouterr().out
    manifest = Path(re.search(r"manifest (\S+)$", out.strip()).group(1))
    return code, out, read_results(manifest)


def test_no_run_reports_missing_points(tmp_path, capsys):
    code, out, manifest = run_sweep(capsys, "--np", "1,2", "--out-dir", str(tmp_path),
                                    "--no-run", "--repeats", "2", "--repeat-index", "1")
    assert code == 1
    assert [(r["np"], r["repeat"], r["status"]) for r in manifest["runs"]] == [
        (1, 1, "missing"), (2, 1, "missing")]
    assert not list(tmp_path.glob("*.h5"))
    assert (tmp_path / "manifest-r1.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--np", "1,3", "--global-batch", "64"], "not divisible by 3"),
    (["--repeats", "0"], "--repeats"),
    (["--out", "x.h5"], "--out is set per run"),
    (["--algorithm=asgd"], "--algorithm is set per run"),
    (["--algorithms", "ssgd,ssdg"], "unknown ssdg (ssdg: did you mean ssgd?); known: ssgd,"),
    (["--out-dir", "/dev/null/runs"], "--out-dir /dev/null/runs: /dev/null is a file"),
    (["--manifest", "/dev/null/m.json"], "--manifest /dev/null/m.json: /dev/null is a file"),
])
def test_bad_requests_fail_before_launching(flags, message, tmp_path, capsys):
    args, extra = parse("--out-dir", str(tmp_path), *flags)
    assert sweep_command.run(args, extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not os.listdir(tmp_path)


def test_plan_batches_names_and_a_seeded_order_within_each_repeat():
    args, _ = parse("--mode", "strong", "--np", "1,2,4", "--global-batch", "128",
                    "--algorithms", "ssgd,odsgd", "--repeats", "2", "--out-dir", "d")
    scenario = parse_scenario(sweep_scenario(args), "sweep", "test")

    def plan(seed: int, only: int | None = None):
        return plan_scaling(scenario, 2, seed, Path("d"), [], check=False, only_repeat=only)

    runs = plan(7)
    assert len(runs) == 12
    canonical = sorted(runs, key=lambda r: (r.repeat, r.cell))
    assert [(r.repeat, r.np, r.algorithm) for r in canonical[:3]] == [
        (0, 1, "ssgd"), (0, 1, "odsgd"), (0, 2, "ssgd")]
    assert {(r.np, r.batch_size) for r in runs} == {(1, 128), (2, 64), (4, 32)}
    assert str(canonical[-1].path) == os.path.join("d", "odsgd-strong-np4-r1.h5")
    # the runner's shuffle: every point once per repeat, repeats in turn, seeded
    assert [r.repeat for r in runs] == [0] * 6 + [1] * 6
    assert [r.run_id for r in runs] == [r.run_id for r in plan(7)] != [
        r.run_id for r in plan(8)]
    assert [r.run_id for r in plan(7, only=1)] == [r.run_id for r in runs[6:]]
    assert sweep.report_path(Path("d/manifest-np2.json"), "md") == Path("d/report-np2.md")
    assert sweep.report_path(Path("d/results.json"), "md") == Path("d/report.md")


def _hand_made(path: Path, n: int, t0: float, t1: float) -> None:
    """A complete run file of the planned weak point (np=n, batch 32) run over [t0, t1]."""
    import numpy as np

    from syncbench.analysis import schema
    from syncbench.bench.train.recorder import write_run_file

    steps = 16
    rows = {r: {name: np.zeros(steps, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
            for r in range(n)}
    for cols in rows.values():
        cols["step"][:] = np.arange(steps)
        cols["samples"][:] = 32
        cols["t_compute"][:] = 0.01
    evals = {name: np.zeros(1, dtype=dtype) for name, dtype in schema.EVAL_COLUMNS.items()}
    root = {"algorithm": "ssgd", "model": "mlp", "dataset": "synthetic", "world_size": n,
            "config": {"batch_size": 32, "epochs": 1.0 * n}, "hostnames": ["node0"],
            "scaling_mode": "weak", "t_begin_unix": t0, "t_end_unix": t1,
            "host_cores": 2, "host_cpus": 2, "ranks_per_host": n}
    attrs = {r: {"hostname": "node0", "device": "cpu", "slowdown": 1.0} for r in range(n)}
    write_run_file(path, root, rows, attrs, evals, 0.16, None)


def test_overlapped_runs_are_flagged_and_get_no_efficiency(tmp_path, capsys):
    _hand_made(tmp_path / "ssgd-weak-np1-r0.h5", 1, 100.0, 110.0)
    _hand_made(tmp_path / "ssgd-weak-np2-r0.h5", 2, 105.0, 115.0)  # started side by side
    args, extra = parse("--mode", "weak", "--np", "1,2", "--batch-size", "32",
                        "--out-dir", str(tmp_path), "--no-run", "--epochs", "1")
    assert sweep_command.run(args, extra) == 0
    out = capsys.readouterr()
    table = out.out[out.out.index("# weak scaling"):]
    for n in (1, 2):
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| ssgd       |   {n} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[4] == "16"  # steps per rank
        assert cells[7] == cells[8] == "overlapped"
    assert "# overlapped: ssgd-weak-np1-r0.h5, ssgd-weak-np2-r0.h5" in table
    assert "overlapped another run on the same host" in out.err
    # run one after the other: weak efficiency = wall(N0) / wall(N) = 1 here
    _hand_made(tmp_path / "ssgd-weak-np2-r0.h5", 2, 120.0, 130.0)
    assert sweep_command.run(args, extra) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("| ssgd       |   2 |"))
    assert [c.strip() for c in line.strip("|").split("|")][7:9] == ["2.000", "1.000"]


def _hand_file(path: Path, wall: float, diverged: bool) -> str:
    """A 2-rank SSGD run file of 8 steps of 64 samples per rank, ``wall`` seconds."""
    import h5py

    small_ssgd_run(path, wall=wall)
    with h5py.File(path, "r+") as f:
        f["summary"].attrs["diverged"] = diverged
    return str(path)


def test_sweep_report_is_the_reports_tables_and_leaves_diverged_speed_out(tmp_path):
    # the diverged run is four times faster; it must not raise the samples/s median
    runs = [sweep.PointOutcome(f"r{i}", "ssgd", "ssgd", 2, i, 64,
                               _hand_file(tmp_path / f"r{i}.h5", w, d))
            for i, (w, d) in enumerate(((0.5, True), (2.0, False), (4.0, False)))]
    text = _report_text(runs, runs, "md")
    assert "| algorithm | world_size | samples_per_s |" not in text  # no raw summary table
    assert "## Runs" in text and "## Stragglers" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| ssgd "))
    assert f"{(1024 / 2.0 + 1024 / 4.0) / 2:.1f}" in row  # median of the non-diverged
    all_diverged = [sweep.PointOutcome("d", "ssgd", "ssgd", 2, 0, 64,
                                       _hand_file(tmp_path / "d.h5", 1.0, True))]
    text = _report_text(all_diverged, all_diverged, "md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| ssgd "))
    assert "diverged" in row


def test_report_of_a_sweeps_folder_reprints_its_scaling_table(tmp_path, capsys):
    """``syncbench report OUT_DIR`` (or its manifest.json) of a sweep prints the scaling
    table the sweep printed, line for line, from the manifest's runs."""
    from syncbench.bench.cli import main

    _hand_made(tmp_path / "ssgd-weak-np1-r0.h5", 1, 100.0, 110.0)
    _hand_made(tmp_path / "ssgd-weak-np2-r0.h5", 2, 120.0, 130.0)
    args, extra = parse("--mode", "weak", "--np", "1,2", "--batch-size", "32",
                        "--out-dir", str(tmp_path), "--no-run", "--epochs", "1")
    assert sweep_command.run(args, extra) == 0
    out = capsys.readouterr().out
    table = out[out.index("# weak scaling"):out.index("\nsweep: ")].strip()
    assert "| ssgd       |   2 |" in table
    for spec in (tmp_path, tmp_path / "manifest.json"):
        assert main(["report", str(spec)]) == 0
        report = capsys.readouterr().out
        assert report.startswith(f"# {tmp_path / 'manifest.json'}: the scaling table of its "
                                 f"runs\n\n{table}\n")


def test_a_scaling_scenario_reaches_the_simulators_16384_ranks():
    """``sweep --simulate --np 8,...,16384`` is a scaling scenario: its np list may reach
    the simulator's largest job, not beyond."""
    from syncbench.bench.experiment.scenario import ScenarioError

    runs = [{"label": "asgd", "algorithm": "asgd"}]
    scenario = parse_scenario({"np": [8, 16384], "scaling": "weak", "run": runs}, "w", "w")
    assert scenario.np == 8
    with pytest.raises(ScenarioError, match=r"\[1, 16384\]"):
        parse_scenario({"np": [8, 16385], "scaling": "weak", "run": runs}, "w", "w")
