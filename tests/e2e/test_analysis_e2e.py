"""Scaling tables, plots and traces: hand-made run files and short real runs: the tests that
launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_analysis.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from helpers import run_mpi
from test_analysis import PNG_MAGIC, _report

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.commands import trace as trace_command

SMALL = ["--algorithm", "ssgd", "--dataset", "synthetic", "--synthetic-samples", "1024",
         "--epochs", "1", "--progress", "never"]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    paths = []
    for n in (2, 4):
        path = out / f"ssgd-np{n}.h5"
        proc = run_mpi(n, "train", *SMALL, "--out", str(path), timeout=120)
        assert proc.returncode == 0, proc.stderr
        paths.append(str(path))
    return paths


@pytest.mark.slow
def test_real_runs_every_plot_is_a_png(real_runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    rc, out, err = _report(*real_runs, "--plots", str(plots), "--plot-format", "png",
                           "--per-run-plots",
                           "--timeline-steps", "1:3", capsys=capsys)
    assert rc == 0, err
    expected = {"scaling.png", "convergence.png"}
    for path in real_runs:
        stem = Path(path).stem
        expected |= {f"{stem}_phases.png", f"{stem}_timeline.png"}
    assert {p.name for p in plots.iterdir()} == expected
    for name in expected:
        data = (plots / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), name
    assert "no run has non-zero local_steps" in err and "local-step schedule plot skipped" in err
    assert "headline plot skipped: no configuration has the baseline (ssgd)" in err
    assert f"wrote {len(expected)} plots" in err


def _trace(run_path: str, out: Path, *extra: str) -> dict:
    parser = argparse.ArgumentParser()
    trace_command.add_arguments(parser)
    assert trace_command.run(parser.parse_args([run_path, "-o", str(out), *extra])) == 0
    return json.loads(out.read_text())


def _slices(trace: dict, cat: str = "phase") -> list[tuple[int, int, str]]:
    return [(e["pid"], e["args"]["step"], e["name"])
            for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == cat]


def test_real_trace_one_slice_per_phase_step_rank(real_runs, tmp_path):
    for path in real_runs:
        run = read_run(path)
        trace = _trace(path, tmp_path / "trace.json")
        assert isinstance(trace["traceEvents"], list)
        slices = _slices(trace)
        expected = [(r, int(s), p) for r in sorted(run.ranks)
                    for i, s in enumerate(run.ranks[r]["step"]) for p in schema.PHASES
                    if run.ranks[r][f"t_{p}"][i] >= 1e-9]  # zero-length phases left out
        assert len(slices) == len(set(slices))  # at most one each
        assert set(slices) <= set(expected) and len(expected) - len(slices) <= 2
        assert sorted(_slices(trace, "step")) == sorted(
            (r, int(s), f"step {int(s)}") for r in run.ranks for s in run.ranks[r]["step"])
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
        assert names == {r: f"rank {r} ({run.rank_attrs[r]['hostname']})" for r in run.ranks}
        for e in trace["traceEvents"]:
            if e["ph"] == "X":
                assert e["dur"] > 0 and e["ts"] >= 0
        evals = [e for e in trace["traceEvents"] if e["ph"] == "i"]
        assert len(evals) == len(run.eval["step"])


def test_real_trace_steps_cut(real_runs, tmp_path):
    path = real_runs[0]  # 2 ranks, 8 steps each
    run = read_run(path)
    steps = run.ranks[0]["step"]
    assert len(steps) >= 4
    trace = _trace(path, tmp_path / "cut.json", "--steps", "1:3")
    assert {(r, s) for r, s, _ in _slices(trace)} == {(r, s) for r in run.ranks for s in (1, 2)}
    assert {s for _, s, _ in _slices(trace, "step")} == {1, 2}
    kept = [e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "i"]
    assert all(2 <= k <= 3 for k in kept)  # evaluations right after steps 1 or 2
    assert kept == [int(s) for s in run.eval["step"] if 2 <= s <= 3]
    open_end = _trace(path, tmp_path / "tail.json", "--steps", f"{len(steps) - 1}:")
    assert {s for _, s, _ in _slices(open_end)} == {len(steps) - 1}


def test_trace_bad_input(tmp_path, real_runs, capsys):
    parser = argparse.ArgumentParser()
    trace_command.add_arguments(parser)
    args = parser.parse_args([real_runs[0], "-o", str(tmp_path / "x.json"), "--steps", "4:2"])
    assert trace_command.run(args) == 2
    assert "--steps" in capsys.readouterr().err
    args = parser.parse_args([str(tmp_path / "none.h5"), "-o", str(tmp_path / "x.json")])
    assert trace_command.run(args) == 2
    assert "does not exist" in capsys.readouterr().err
