"""Incomplete runs (``complete=False``): stopped by a signal, or rebuilt by ``recover``.

Hand-made run files (``bench.recorder.write_run_file``) with chosen wall times
and samples: ``syncbench report`` names why a run is incomplete, carries
``stopped_by`` and ``resumes`` in its rows, and computes no speedup,
efficiency or hidden communication from such a run, as the run or as the
baseline, nor for a group with one. The scenario runner is driven in-process
with a stand-in for ``mpiexec ... syncbench train`` that writes such files and
exits as a stopped run does (128 + the signal), so no run is launched.

Split off this module: ``tests/e2e/test_incomplete_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import csv
import io
import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
from helpers import report_cli

from syncbench.analysis import schema
from syncbench.analysis.completeness import incomplete_reason
from syncbench.analysis.repeats import format_spread, group_rows
from syncbench.analysis.report import (
    format_report,
    report_rows,
)
from syncbench.analysis.runfile import read_run
from syncbench.analysis.tables import table_rows
from syncbench.bench.experiment import runner
from syncbench.bench.experiment.aggregate import scenario_cells
from syncbench.bench.experiment.print_tables import comparison_table
from syncbench.bench.train.recorder import write_run_file

BATCH = 64
RATIO_KEYS = ("speedup", "efficiency", "speedup_wall", "efficiency_wall")


def make_rank(steps: int, phases: dict[str, float]) -> dict[str, np.ndarray]:
    """Rows of one rank: the same phase seconds every step, ``BATCH`` samples each."""
    duration = sum(phases.values())
    cols = {
        "step": np.arange(steps), "t_start": np.arange(steps) * duration,
        **{f"t_{p}": np.full(steps, phases.get(p, 0.0)) for p in schema.PHASES},
        "loss": np.linspace(2.0, 1.0, steps), "samples": np.full(steps, BATCH),
    }
    for name, dtype in schema.RANK_COLUMNS.items():
        cols.setdefault(name, np.zeros(steps, dtype=dtype))
    return cols


def make_evals() -> dict[str, np.ndarray]:
    return {"t": np.array([0.5, 1.0]), "step": np.array([2, 4]),
            "samples_seen": np.array([256, 512]), "loss": np.array([1.0, 0.5]),
            "accuracy": np.array([0.6, 0.9])}


def write(path: Path, *, world_size: int, wall: float, steps: int, algorithm: str = "ssgd",
          complete: bool = True, stopped_by: str = "", resumes: int = 0,
          config: dict | None = None, phases: dict | None = None,
          ranks: int | None = None) -> str:
    """A ``syncbench/1`` file; ``ranks``: how many rank groups it keeps (a recovered run)."""
    phases = phases or {"compute": 0.01}
    rows = {r: make_rank(steps, phases) for r in range(world_size if ranks is None else ranks)}
    root = {
        "algorithm": algorithm, "model": "mlp", "dataset": "synthetic",
        "world_size": world_size, "resumes": resumes, "buckets": 1,
        "config": {"algorithm": algorithm, "batch_size": BATCH, "comm": "overlap",
                   "slowdown": None, "target_accuracy": 0.8, **(config or {})},
        "hostnames": [f"node{r}" for r in range(world_size)],
    }
    attrs = {r: {"hostname": f"node{r}", "device": "cpu", "slowdown": 1.0} for r in rows}
    write_run_file(path, root, rows, attrs, make_evals(), wall, 0.8, complete=complete,
                   stopped_by=stopped_by)
    return str(path)


@pytest.fixture
def strong(tmp_path):
    """Strong scaling, 4096 samples: N = 1, 2, 4 complete, then a stopped N = 4 (a quarter
    of its budget, resumed once) and a recovered N = 2 (one of its two ranks' parts)."""
    return [
        write(tmp_path / "n1.h5", world_size=1, wall=8.0, steps=64),
        write(tmp_path / "n2.h5", world_size=2, wall=5.0, steps=32),
        write(tmp_path / "n4.h5", world_size=4, wall=2.5, steps=16),
        write(tmp_path / "n4-stopped.h5", world_size=4, wall=0.5, steps=4, complete=False,
              stopped_by="SIGTERM", resumes=1),
        write(tmp_path / "n2-recovered.h5", world_size=2, wall=1.0, steps=8, complete=False,
              ranks=1),
    ]


_report = report_cli


def _md_row(out: str, name: str) -> dict[str, str]:
    """The cells of the first Markdown row of run file ``name`` under the header before it."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {name} "))
    header = next(lines[j] for j in range(i, -1, -1) if lines[j].startswith("| run "))
    cols = [c.strip() for c in header.strip("|").split("|")]
    return dict(zip(cols, (c.strip() for c in lines[i].strip("|").split("|")), strict=True))


# ---------------------------------------------------------------- the report


def test_incomplete_reason_names_the_signal_or_recover():
    assert incomplete_reason(True, "") == "" and incomplete_reason(None) == ""
    assert incomplete_reason(False, "SIGTERM") == "stopped by SIGTERM"
    assert incomplete_reason(False, "") == "partial (recovered)"


def test_report_says_why_a_run_is_incomplete_and_gives_it_no_speedup(strong, capsys):
    rc, out, err = _report(*strong, capsys=capsys)
    assert rc == 0, err
    warnings = err.splitlines()
    assert len(warnings) == 2
    assert strong[3] in warnings[0] and "stopped by SIGTERM" in warnings[0]
    assert "resumed 1x" in warnings[0] and "gets no speedup" in warnings[0]
    assert strong[4] in warnings[1] and "'partial (recovered)'" in warnings[1]
    assert "1 of 2 ranks" in warnings[1]
    stopped, recovered, n4 = (_md_row(out, n) for n in
                              ("n4-stopped.h5", "n2-recovered.h5", "n4.h5"))
    assert stopped["note"] == "stopped by SIGTERM, resumed 1x"
    assert recovered["note"] == "partial (recovered)"
    assert n4["note"] == "" and n4["speedup"] == "3.20" and n4["efficiency"] == "0.80"
    assert stopped["speedup"] == stopped["efficiency"] == "-"   # finite for a complete N=4
    assert recovered["speedup"] == recovered["efficiency"] == "-"
    assert "stopped_by" not in out.split("\n\n")[2]  # the note says it, not a column
    assert "\nincomplete runs get no speedup: " in out
    assert "\nstopped by SIGTERM: the run was stopped by that signal" in out
    assert "\npartial (recovered): rebuilt by syncbench recover" in out
    # the scaling table too, with both wall-time forms
    i = out.index("## Scaling and communication")
    row = _md_row(out[i:], "n4-stopped.h5")
    assert row["speedup (wall)"] == row["efficiency (wall)"] == "-" and row["N0"] == "1"
    assert _md_row(out[i:], "n4.h5")["speedup (wall)"] == "3.20"


def test_report_json_and_csv_carry_stopped_by_and_resumes(strong, capsys):
    rc, out, _ = _report(*strong, "--format", "json", capsys=capsys)
    assert rc == 0
    data = json.loads(out)
    keys = [*schema.REPORT_KEYS, "path"]
    assert schema.REPORT_KEYS[-2:] == ("stopped_by", "resumes")
    for obj in data:
        assert list(obj)[: len(keys)] == keys
    assert [(o["stopped_by"], o["resumes"], o["complete"]) for o in data] == [
        ("", 0, True), ("", 0, True), ("", 0, True), ("SIGTERM", 1, False), ("", 0, False)]
    assert data[2]["speedup"] == pytest.approx(3.2)
    for obj in data[3:]:
        assert all(obj[k] is None for k in (*RATIO_KEYS, "hidden_comm_fraction"))
        assert obj["scaling"] == "strong" and obj["baseline_world_size"] == 1
    rc, out, _ = _report(*strong, "--format", "csv", capsys=capsys)
    records = list(csv.DictReader(io.StringIO(out)))
    assert records[3]["stopped_by"] == "SIGTERM" and records[3]["resumes"] == "1"
    assert records[3]["speedup"] == "" and float(records[2]["speedup"]) == pytest.approx(3.2)
    # the plain summary table has the keys too
    rows = report_rows(strong)
    assert rows[3]["stopped_by"] == "SIGTERM" and rows[3]["resumes"] == 1
    plain = json.loads(format_report(rows, "json"))
    assert plain[4]["stopped_by"] == "" and plain[4]["resumes"] == 0


def test_an_incomplete_run_is_no_baseline_and_does_not_make_a_series_mixed(tmp_path):
    paths = [write(tmp_path / "n1-stopped.h5", world_size=1, wall=1.0, steps=8,
                   complete=False, stopped_by="SIGINT"),
             write(tmp_path / "n2.h5", world_size=2, wall=4.0, steps=32),
             write(tmp_path / "n4.h5", world_size=4, wall=2.0, steps=16)]
    rows = table_rows([read_run(p) for p in paths])
    # its 512 samples would make the series "mixed" and N0 = 1
    assert [r["scaling"] for r in rows] == ["strong"] * 3
    assert [r["baseline_world_size"] for r in rows] == [2, 2, 2]
    assert all(math.isnan(rows[0][k]) for k in RATIO_KEYS)
    assert rows[1]["speedup"] == pytest.approx(1.0) and rows[2]["speedup"] == pytest.approx(2.0)
    # with the complete runs alone the figures are the same
    alone = table_rows([read_run(p) for p in paths[1:]])
    assert [r["speedup"] for r in alone] == [r["speedup"] for r in rows[1:]]


def test_a_group_with_an_incomplete_run_gets_no_speedup(strong, capsys):
    rows = table_rows([read_run(p) for p in strong], by=("world_size",))
    groups = {g["world_size"]: g for g in group_rows(rows, ("world_size",))}
    assert groups[1]["speedup"] == 1.0 and groups[1]["complete"] is True
    for n in (2, 4):  # each has a complete run with a finite speedup and an incomplete one
        g = groups[n]
        assert g["complete"] is False and g["repeats"] == 2
        for key in RATIO_KEYS:
            assert math.isnan(g[key])
        for key in ("speedup", "efficiency"):
            assert math.isnan(g[f"{key}_min"]) and math.isnan(g[f"{key}_max"])
    assert groups[4]["stopped_by"] == "SIGTERM" and groups[4]["resumes"] == 1
    assert groups[2]["stopped_by"] == "" and groups[2]["resumes"] == 0
    rc, out, _ = _report(*strong, "--by", "world_size", capsys=capsys)
    assert rc == 0
    body = out.split("## Spread over repeats")[0]
    lines = [ln for ln in body.splitlines() if ln.startswith("| ssgd ")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header = [c.strip() for c in next(ln for ln in body.splitlines()
                                      if ln.startswith("| algorithm ")).strip("|").split("|")]
    by_n = {c[1]: dict(zip(header, c, strict=True)) for c in cells}
    assert by_n["1"]["speedup"] == "1.00"
    assert by_n["2"]["speedup"] == by_n["4"]["speedup"] == "-"
    assert by_n["2"]["note"] == "1/2 partial (recovered)"
    assert by_n["4"]["note"] == "1/2 stopped by SIGTERM, resumed 1x"
    spread = out.split("## Spread over repeats")[1].split("## Time per phase")[0]
    row4 = next(ln for ln in spread.splitlines() if ln.startswith("|          4 "))
    assert row4.rstrip().endswith("|                 - |                    - |")
    rc, out, _ = _report(*strong, "--by", "world_size", "--format", "json", capsys=capsys)
    data = {g["world_size"]: g for g in json.loads(out)}
    assert data[4]["speedup"] is None and data[4]["stopped_by"] == "SIGTERM"
    assert "_incomplete" not in data[4]


def test_an_incomplete_run_is_no_hidden_communication_reference(tmp_path):
    ph = {"compute": 0.2, "comm": 0.25}

    def odsgd(name, **kw):
        return write(tmp_path / name, world_size=2, wall=4.0, steps=8, algorithm="odsgd",
                     phases={"compute": 0.2, "wait": 0.05}, **kw)

    ref = write(tmp_path / "ref.h5", world_size=2, wall=4.0, steps=8, phases=ph,
                config={"comm": "blocking"})
    ref_stopped = write(tmp_path / "ref-stopped.h5", world_size=2, wall=4.0, steps=8,
                        phases=ph, config={"comm": "blocking"}, complete=False,
                        stopped_by="SIGTERM")
    run, stopped = odsgd("od.h5"), odsgd("od-stopped.h5", complete=False, stopped_by="SIGUSR1")
    rows = table_rows([read_run(p) for p in (ref, run, stopped)])
    assert rows[1]["hidden_comm_fraction"] == pytest.approx((0.45 - 0.25) / 0.25)
    assert math.isnan(rows[2]["hidden_comm_fraction"])  # the same steps, but incomplete
    rows = table_rows([read_run(p) for p in (ref_stopped, run)])
    assert all(math.isnan(r["hidden_comm_fraction"]) for r in rows)  # no reference left


# ---------------------------------------------------------------- the runner's cells


def _record(label, repeat, sps, ttt=1.0, complete=True, stopped_by=""):
    return {"label": label, "condition": "hom", "repeat": repeat, "time_to_target_s": ttt,
            "diverged": False, "samples_per_s": sps, "final_accuracy": 0.9, "wall_s": 1.0,
            "realised_factor": math.nan, "interference_ratio": math.nan,
            "hidden_comm_fraction": 0.5, "overlapped": False, "complete": complete,
            "stopped_by": stopped_by}


def test_runner_cells_leave_incomplete_runs_out_of_every_figure_and_ratio():
    records = [_record("base", 0, 100.0), _record("base", 1, 50.0, complete=False,
                                                  stopped_by="SIGTERM"),
               _record("base", 2, 100.0),
               _record("x", 0, 200.0, ttt=0.5), _record("x", 1, 150.0),
               _record("x", 2, 999.0, ttt=0.1, complete=False),
               _record("gone", 0, 500.0, complete=False, stopped_by="SIGINT")]
    cells = {c["label"]: c for c in scenario_cells(records, ["base", "x", "gone"], ["hom"],
                                                    "base")}
    x = cells["x"]
    # repeat 1: the baseline is incomplete; repeat 2: x is; only repeat 0 gives ratios
    assert x["sps_ratio"]["n"] == 1 and x["sps_ratio"]["median"] == 2.0
    assert x["ttt_ratio"]["n"] == 1 and x["ttt_ratio"]["median"] == 0.5
    assert x["samples_per_s"]["max"] == 200.0 and x["samples_per_s"]["n"] == 2
    assert x["runs"] == 3 and x["incomplete"] == 1
    assert x["incomplete_reasons"] == ["partial (recovered)"]
    assert cells["base"]["samples_per_s"]["min"] == 100.0
    gone = cells["gone"]
    assert gone["incomplete"] == gone["runs"] == 1
    assert format_spread(gone["samples_per_s"]) == format_spread(gone["sps_ratio"]) == "incomplete"
    assert gone["time_to_target_s"]["status"] == "incomplete"
    lines = comparison_table("s", "homogeneous", list(cells.values()), "base", 0.8,
                             "time_to_target", [{}])
    text = "\n".join(lines)
    row = next(ln for ln in lines if ln.startswith("  x "))
    assert row.rstrip().endswith("3 (1 inc)")
    assert "  ! x: 1 of 3 run(s) incomplete (partial (recovered)): left out of every figure" \
        in text
    assert "  ! base: 1 of 3 run(s) incomplete (stopped by SIGTERM)" in text
    gone_row = next(ln for ln in lines if ln.startswith("  gone "))
    assert gone_row.count("incomplete") >= 6 and "not reached" not in gone_row


def test_stop_signal_reads_the_exit_status():
    assert runner.stop_signal(143) == "SIGTERM" and runner.stop_signal(130) == "SIGINT"
    assert runner.stop_signal(128 + int(signal.SIGUSR1)) == "SIGUSR1"
    assert runner.stop_signal(-15) == "SIGTERM"
    assert runner.stop_signal(1) == runner.stop_signal(137) == runner.stop_signal(0) == ""


# ---------------------------------------------------------------- the runner, in-process
