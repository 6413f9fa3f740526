"""Incomplete runs (``complete=False``): stopped by a signal, or rebuilt by ``recover``: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_incomplete.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from pathlib import Path

from test_incomplete import write

from syncbench.bench.experiment import runner
from syncbench.bench.experiment.scenario import parse_scenario


class FakeTrain:
    """Stands in for ``run_train``: writes the run file the flags name and exits 0, or,
    for the calls in ``stop`` (1-based), writes it ``complete=False`` and exits 128 + the
    signal, after sending that signal to this process when ``to_runner``."""

    def __init__(self, stop: dict[int, str] | None = None, to_runner: bool = False,
                 write_file: bool = True):
        self.stop = stop or {}
        self.to_runner = to_runner
        self.write_file = write_file
        self.calls: list[str] = []

    def __call__(self, np_, args, mpiexec=None, timeout=None, quiet=False):
        flags = dict(zip(args[::2], args[1::2]))  # the plan's flags come in pairs
        out = Path(args[args.index("--out") + 1])
        self.calls.append(out.stem)
        algorithm = args[args.index("--algorithm") + 1]
        name = self.stop.get(len(self.calls), "")
        if name and self.to_runner:
            os.kill(os.getpid(), signal.Signals[name])
        fast = 1.0 if algorithm == "ssgd" else 0.5
        if self.write_file or not name:
            write(out, world_size=np_, wall=0.5 if name else 2.0 * fast,
                  steps=4 if name else 16, algorithm=algorithm, complete=not name,
                  stopped_by=name, config={"seed": int(flags.get("--seed", 0))})
        code = 128 + int(signal.Signals[name]) if name else 0
        return subprocess.CompletedProcess(args, code, "", "stopped" if name else "")


def _scenario():
    return parse_scenario({"np": 2, "repeats": 2, "target_accuracy": 0.8,
                           "flags": {"dataset": "synthetic", "epochs": 1},
                           "run": [{"label": "base", "algorithm": "ssgd"},
                                   {"label": "fast", "algorithm": "oscars"}]},
                          "pair", "pair.toml")


def _run(tmp_path, monkeypatch, fake, *more):
    monkeypatch.setattr(runner, "run_train", fake)
    parser = argparse.ArgumentParser()
    runner.add_runner_arguments(parser)
    args = parser.parse_args(["--out-dir", str(tmp_path / "runs"), "--order-seed", "3", *more])
    return runner.run_scenario(_scenario(), args, [])


def test_runner_flags_a_stopped_run_and_counts_it_in_its_last_line(tmp_path, monkeypatch,
                                                                   capsys):
    fake = FakeTrain(stop={2: "SIGTERM"})
    rc = _run(tmp_path, monkeypatch, fake)
    out = capsys.readouterr().out
    assert rc == runner.EXIT_INCOMPLETE == 3
    assert len(fake.calls) == 4  # the runner went on after the stopped run
    stopped_id = fake.calls[1]
    progress = next(ln for ln in out.splitlines() if "repeat " in ln and ln.startswith("[2/4]"))
    assert "STOPPED by SIGTERM" in progress
    assert "(1 inc)" in out
    label = stopped_id.split("-")[0]
    assert f"  ! {label}: 1 of 2 run(s) incomplete (stopped by SIGTERM)" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("incomplete: 1 of 4 runs did not consume their sample budget "
                           f"({stopped_id} stopped by SIGTERM)")
    results = json.loads((tmp_path / "runs" / "results.json").read_text())
    assert results["complete"] is True and results["stopped_by"] == ""
    assert results["incomplete_runs"] == [stopped_id]
    record = next(r for r in results["runs"] if r["run_id"] == stopped_id)
    assert record["complete"] is False and record["stopped_by"] == "SIGTERM"
    # no ratio from the stopped run: its repeat gives none
    cell = next(c for c in results["cells"] if c["label"] == "fast")
    assert cell["sps_ratio"]["n"] == 1
    # --resume keeps the complete runs and runs the stopped one again
    again = FakeTrain()
    rc = _run(tmp_path, monkeypatch, again, "--resume")
    out = capsys.readouterr().out
    assert rc == 0 and again.calls == [stopped_id]
    assert out.count("kept by --resume") == 3
    assert json.loads((tmp_path / "runs" / "results.json").read_text())["incomplete_runs"] == []


def test_a_stopped_runner_starts_no_new_run_and_exits_128_plus_the_signal(
        tmp_path, monkeypatch, capfd):
    fake = FakeTrain(stop={2: "SIGINT"}, to_runner=True)
    before = signal.getsignal(signal.SIGINT)
    rc = _run(tmp_path, monkeypatch, fake)
    out, err = capfd.readouterr()
    assert rc == 128 + int(signal.SIGINT) == 130
    assert signal.getsignal(signal.SIGINT) is before  # the runner's handler is gone
    assert len(fake.calls) == 2  # the current run ended; no new one started
    assert "SIGINT: no new run starts; the current one ends first" in err
    assert "# pair: homogeneous" in out  # the table of what ended
    last = out.strip().splitlines()[-1]
    assert last == (f"stopped by SIGINT: 2 of 4 runs ended, 1 of them incomplete "
                    f"({fake.calls[1]} stopped by SIGINT), in no figure or ratio; 2 not "
                    "started; rerun with --resume to run the rest")
    results = json.loads((tmp_path / "runs" / "results.json").read_text())
    assert results["complete"] is False and results["stopped_by"] == "SIGINT"
    assert [r["run_id"] for r in results["runs"]] == fake.calls


def test_a_stopped_runner_whose_run_left_no_file_tabulates_the_rest(tmp_path, monkeypatch,
                                                                    capfd):
    fake = FakeTrain(stop={2: "SIGTERM"}, to_runner=True, write_file=False)
    rc = _run(tmp_path, monkeypatch, fake)
    out, _ = capfd.readouterr()
    assert rc == 128 + int(signal.SIGTERM)
    assert f"# {fake.calls[1]} ended without a run file (exit 143) after SIGTERM" in out
    assert out.strip().splitlines()[-1].startswith("stopped by SIGTERM: 1 of 4 runs ended, "
                                                   "all complete; 3 not started")
