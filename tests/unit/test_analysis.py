"""Scaling tables, plots and traces: hand-made run files and short real runs.

Hand-made files (``bench.recorder.write_run_file``) have chosen wall times,
samples and phase seconds, so every table value is checked against a closed
form computed here. The real runs (2 and 4 ranks, launched with ``mpiexec`` by
the fixture) check plots and traces end to end. Serial pytest run; every
subprocess is bounded by a timeout.

Split off this module: ``tests/e2e/test_analysis_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import report_cli

from syncbench.analysis import plots, schema
from syncbench.analysis.columns import row_keys
from syncbench.analysis.plot_style import pyplot
from syncbench.analysis.repeats import group_rows
from syncbench.analysis.report import (
    format_report,
    report_rows,
)
from syncbench.analysis.runfile import read_run
from syncbench.analysis.tables import table_rows
from syncbench.analysis.trace import parse_steps, trace_events
from syncbench.bench.train.recorder import write_run_file

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BATCH = 64


# ---------------------------------------------------------------- hand-made files


def make_rank(steps: int, phases: dict[str, float], *, batch: int = BATCH,
              local_steps: int = 0, rounds: list[int] | None = None,
              step_time: float | None = None) -> dict[str, np.ndarray]:
    """Rows of one rank: the same phase seconds every step, steps back to back."""
    duration = step_time if step_time is not None else sum(phases.values())
    cols = {
        "step": np.arange(steps),
        "t_start": np.arange(steps) * duration,
        **{f"t_{p}": np.full(steps, phases.get(p, 0.0)) for p in schema.PHASES},
        "loss": np.linspace(2.0, 1.0, steps),
        "samples": np.full(steps, batch),
        "staleness": np.zeros(steps, dtype=int),
        "local_steps": np.full(steps, local_steps),
        "round": np.asarray(rounds if rounds is not None else np.zeros(steps, dtype=int)),
    }
    for name, dtype in schema.RANK_COLUMNS.items():  # columns added to the schema later
        cols.setdefault(name, np.zeros(steps, dtype=dtype))
    return cols


def make_evals(times=(1.0, 2.0), accuracy=(0.5, 0.9), samples=(512, 1024), steps=(2, 4)):
    return {
        "t": np.asarray(times, dtype=float), "step": np.asarray(steps),
        "samples_seen": np.asarray(samples), "loss": np.linspace(1.5, 0.5, len(times)),
        "accuracy": np.asarray(accuracy, dtype=float),
    }


def write_file(path: Path, *, algorithm: str, world_size: int, wall: float,
               steps_per_rank: int, phases=None, evals=None, config=None,
               complete: bool = True, rank_rows=None, target=None, root=None,
               rank_extra=None) -> str:
    """A ``syncbench/1`` file with chosen wall time and samples (``steps * BATCH`` per rank).

    ``root`` adds or replaces root attributes (e.g. ``mpi_library``, ``scaling_mode``),
    ``rank_extra`` rank attributes (rank -> {name: value}).
    """
    phases = phases or {"compute": 0.01}
    rows = rank_rows or {r: make_rank(steps_per_rank, phases) for r in range(world_size)}
    root = {
        "algorithm": algorithm, "model": "mlp", "dataset": "synthetic",
        "world_size": world_size,
        "config": {"algorithm": algorithm, "batch_size": BATCH, "comm": "overlap",
                   "slowdown": None, "target_accuracy": target, **(config or {})},
        "hostnames": [f"node{r}" for r in range(world_size)],
        **(root or {}),
    }
    attrs = {r: {"hostname": f"node{r}", "device": "cpu", "slowdown": 1.0,
                 **(rank_extra or {}).get(r, {})}
             for r in range(world_size)}
    write_run_file(path, root, rows, attrs, evals or make_evals(), wall, target,
                   complete=complete)
    return str(path)


# Strong scaling: 4096 samples at every N. N=2 has three repeats (walls 5, 4, 6).
STRONG = [(1, 8.0), (2, 5.0), (2, 4.0), (2, 6.0), (4, 2.5)]
# Weak scaling: 1024 samples per rank.
WEAK = [(1, 2.0), (2, 2.5), (4, 4.0)]


@pytest.fixture
def scaling_files(tmp_path):
    paths = []
    for i, (n, wall) in enumerate(STRONG):
        paths.append(write_file(tmp_path / f"strong{i}.h5", algorithm="ssgd", world_size=n,
                                wall=wall, steps_per_rank=4096 // BATCH // n))
    for i, (n, wall) in enumerate(WEAK):
        paths.append(write_file(tmp_path / f"weak{i}.h5", algorithm="asgd", world_size=n,
                                wall=wall, steps_per_rank=1024 // BATCH))
    return paths


def _rows(paths, by=(), target=None, series=()):
    return table_rows([read_run(p) for p in paths], by, target, series)


def test_strong_scaling_hand_computed(scaling_files):
    rows = [r for r in _rows(scaling_files) if r["algorithm"] == "ssgd"]
    x = {i: 4096 / wall for i, (_, wall) in enumerate(STRONG)}
    x0, wall0 = x[0], STRONG[0][1]
    for i, row in enumerate(rows):
        n, wall = STRONG[i]
        assert row["scaling"] == "strong" and row["baseline_world_size"] == 1
        assert row["samples"] == 4096
        assert row["samples_per_s"] == pytest.approx(x[i])
        assert row["speedup"] == pytest.approx(x[i] / x0)          # T(N0) / T(N)
        assert row["speedup"] == pytest.approx(wall0 / wall)
        assert row["efficiency"] == pytest.approx(wall0 / wall / n)
        assert row["speedup_wall"] == pytest.approx(wall0 / wall)
        assert row["efficiency_wall"] == pytest.approx(wall0 / (wall * n))
    assert [round(r["speedup"], 6) for r in rows] == [1.0, 1.6, 2.0, round(8 / 6, 6), 3.2]
    assert rows[-1]["efficiency"] == pytest.approx(0.8)


def test_weak_scaling_hand_computed(scaling_files):
    rows = [r for r in _rows(scaling_files) if r["algorithm"] == "asgd"]
    for row, (n, wall) in zip(rows, WEAK, strict=True):
        x = 1024 * n / wall
        x0 = 1024 / WEAK[0][1]
        assert row["scaling"] == "weak" and row["baseline_world_size"] == 1
        assert row["samples_per_s_per_rank"] == pytest.approx(1024 / wall)
        # weak efficiency: ratio of throughput per rank = wall(N0) / wall(N)
        assert row["efficiency"] == pytest.approx((x / n) / (x0 / 1))
        assert row["efficiency"] == pytest.approx(WEAK[0][1] / wall)
        assert row["efficiency_wall"] == pytest.approx(WEAK[0][1] / wall)
        assert row["speedup"] == pytest.approx(x / x0)  # scaled speedup
        assert row["speedup_wall"] == pytest.approx(n * WEAK[0][1] / wall)
    assert [round(r["efficiency"], 9) for r in rows] == [1.0, 0.8, 0.5]
    assert [round(r["speedup"], 9) for r in rows] == [1.0, 1.6, 2.0]


def test_mixed_work_and_baseline_is_smallest_n(tmp_path):
    a = write_file(tmp_path / "a.h5", algorithm="ssgd", world_size=2, wall=2.0,
                   steps_per_rank=10)
    b = write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=4, wall=2.0,
                   steps_per_rank=7)  # neither the same total nor the same per rank
    rows = _rows([b, a])
    assert [r["baseline_world_size"] for r in rows] == [2, 2]
    assert all(r["scaling"] == "mixed" for r in rows)
    for row in rows:  # a mixed series gets no speedup
        assert all(math.isnan(row[k]) for k in ("speedup", "efficiency", "speedup_wall",
                                                "efficiency_wall"))


def test_another_strategys_flag_does_not_split_a_series(tmp_path):
    flags = {"strategy_flags": json.dumps(["bucket_mb", "comm"]),
             "option_flags": json.dumps(["bucket_mb", "comm", "period", "worker_momentum"])}

    def run(name, n, momentum, root, bucket_mb=25):
        return write_file(tmp_path / name, algorithm="ssgd", world_size=n, wall=4.0 / n,
                          steps_per_rank=32 // n, root=root,
                          config={"worker_momentum": momentum, "bucket_mb": bucket_mb})

    # ASGD's worker_momentum default changed between the two SSGD runs
    paths = [run("a1.h5", 1, 0.0, flags), run("a2.h5", 2, 0.9, flags)]
    rows = _rows(paths)
    assert rows[0]["series"] == rows[1]["series"]
    assert rows[1]["speedup"] == pytest.approx(2.0)
    # the run's own options still split it
    own = run("b2.h5", 2, 0.9, flags, bucket_mb=1)
    assert len({r["series"] for r in _rows([*paths, own])}) == 2
    # older files (no recorded option names): every flag counts, as before
    old = [run("o1.h5", 1, 0.0, None), run("o2.h5", 2, 0.9, None)]
    rows = _rows(old)
    assert rows[0]["series"] != rows[1]["series"]


def test_series_split_by_a_config_flag(tmp_path):
    paths = [
        write_file(tmp_path / "o1.h5", algorithm="ssgd", world_size=1, wall=4.0,
                   steps_per_rank=32),
        write_file(tmp_path / "b1.h5", algorithm="ssgd", world_size=1, wall=2.0,
                   steps_per_rank=32, config={"comm": "blocking"}),
        write_file(tmp_path / "o2.h5", algorithm="ssgd", world_size=2, wall=2.0,
                   steps_per_rank=16),
    ]
    # the strategy's own flags are part of a series: blocking and overlap never mix
    rows = _rows(paths)
    assert rows[2]["speedup"] == pytest.approx(2.0)
    assert rows[0]["series"] != rows[1]["series"] and "comm=blocking" in rows[1]["series"]
    assert math.isnan(rows[1]["speedup"])  # one world size: no baseline
    assert _rows(paths, series=("comm",))[2]["speedup"] == pytest.approx(2.0)


def test_aggregation_over_repeats(scaling_files):
    rows = _rows(scaling_files, by=("algorithm", "world_size"))
    groups = group_rows(rows, ("algorithm", "world_size"))
    assert [(g["algorithm"], g["world_size"], g["repeats"]) for g in groups] == [
        ("asgd", 1, 1), ("asgd", 2, 1), ("asgd", 4, 1),
        ("ssgd", 1, 1), ("ssgd", 2, 3), ("ssgd", 4, 1)]
    g = groups[4]
    assert (g["wall_s"], g["wall_s_min"], g["wall_s_max"]) == (5.0, 4.0, 6.0)
    assert g["samples_per_s"] == pytest.approx(4096 / 5.0)
    assert g["samples_per_s_min"] == pytest.approx(4096 / 6.0)
    assert g["samples_per_s_max"] == pytest.approx(4096 / 4.0)
    assert g["speedup"] == pytest.approx(1.6)
    assert g["speedup_min"] == pytest.approx(8.0 / 6.0)
    assert g["speedup_max"] == pytest.approx(2.0)
    assert g["efficiency"] == pytest.approx(0.8)
    assert g["path"] == scaling_files[1:4]
    assert g["complete"] is True and g["scaling"] == "strong"


def test_aggregation_time_to_target_counts_misses_as_slow(tmp_path):
    accs = [(0.9, 0.9), (0.5, 0.9), (0.5, 0.6)]  # reached at t=1, t=2, never
    paths = [write_file(tmp_path / f"r{i}.h5", algorithm="ssgd", world_size=2, wall=3.0,
                        steps_per_rank=4, evals=make_evals(accuracy=a))
             for i, a in enumerate(accs)]
    rows = _rows(paths, by=("algorithm",), target=0.8)
    assert [r["time_to_target_s"] for r in rows[:2]] == [1.0, 2.0]
    assert math.isnan(rows[2]["time_to_target_s"])
    (g,) = group_rows(rows, ("algorithm",))
    assert g["time_to_target_s"] == 2.0 and g["time_to_target_s_min"] == 1.0
    assert math.isnan(g["time_to_target_s_max"])
    assert g["target_reached"] == 2 and g["target_accuracy"] == 0.8
    assert g["final_accuracy"] == pytest.approx(0.9)  # median of 0.9, 0.9, 0.6
    assert g["final_accuracy_min"] == pytest.approx(0.6)


PH0 = {"data": 0.1, "compute": 0.2, "comm": 0.05, "wait": 0.15, "update": 0.05}
PH1 = {"data": 0.1, "compute": 0.4, "comm": 0.05, "update": 0.05, "delay": 0.1}


def test_phase_breakdown_stragglers_and_hidden_comm(tmp_path):
    rows = {0: make_rank(4, PH0), 1: make_rank(4, PH1)}
    run = write_file(tmp_path / "od.h5", algorithm="odsgd", world_size=2, wall=4.0,
                     steps_per_rank=4, rank_rows=rows)
    ref = write_file(tmp_path / "ref.h5", algorithm="ssgd", world_size=2, wall=4.0,
                     steps_per_rank=4, phases={"compute": 0.2, "comm": 0.25},
                     config={"comm": "blocking"})
    other_n = write_file(tmp_path / "n4.h5", algorithm="odsgd", world_size=4, wall=4.0,
                         steps_per_rank=2)
    row, ref_row, n4_row = _rows([run, ref, other_n])
    assert row["compute_s_per_step"] == pytest.approx((0.2 + 0.4) / 2)
    assert row["delay_s_per_step"] == pytest.approx(0.05)
    assert row["step_s_mean"] == pytest.approx((0.55 + 0.7) / 2)
    assert row["compute_fraction"] == pytest.approx((0.8 + 1.6) / (2 * 4.0))
    assert row["data_fraction"] == pytest.approx(0.8 / 8.0)
    assert row["comm_fraction"] == pytest.approx(0.4 / 8.0)  # the /summary value
    assert row["untracked_fraction"] == pytest.approx(1 - (2.2 + 2.8) / 8.0)
    assert row["step_s_median"] == pytest.approx(0.625)
    assert row["step_s_max"] == pytest.approx(0.7)
    assert row["step_max_over_median"] == pytest.approx(0.7 / 0.625)
    # busy = data + compute + update + delay: 0.35 and 0.65
    assert row["busy_max_over_median"] == pytest.approx(0.65 / 0.35)
    assert row["slowest_rank"] == 1
    assert row["wait_share_max"] == pytest.approx(0.6 / 4.0)
    assert row["idle_share_max"] == pytest.approx(1 - 1.4 / 4.0)
    assert row["rounds"] == 4
    assert row["exposed_comm_s_per_round"] == pytest.approx((0.2 + 0.05) / 2)
    assert ref_row["exposed_comm_s_per_round"] == pytest.approx(0.25)
    assert row["sync_fraction"] == pytest.approx((0.4 + 0.6) / 8.0)  # comm + wait
    # from step time: (T_ref - T) / C_ref with T = 0.625, T_ref = 0.45, C_ref = 0.25
    assert row["hidden_comm_fraction"] == pytest.approx((0.45 - 0.625) / 0.25)
    assert ref_row["hidden_comm_fraction"] == 0.0
    assert math.isnan(n4_row["hidden_comm_fraction"])  # no blocking reference at N=4


def test_straggler_ratio_sees_waiting_charged_to_comm(tmp_path):
    """Blocking SSGD: the fast rank's wait for the straggler is inside Allreduce (comm)."""
    fast = {"data": 0.1, "compute": 0.2, "comm": 0.65, "update": 0.05}
    slow = {"data": 0.1, "compute": 0.2, "comm": 0.05, "update": 0.05, "delay": 0.6}
    rows = {0: make_rank(4, fast), 1: make_rank(4, slow)}
    path = write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=2, wall=4.0,
                      steps_per_rank=4, rank_rows=rows, config={"comm": "blocking"})
    (row,) = _rows([path])
    # both steps last 1.0 s; counting comm as busy would read 1.0
    assert row["busy_max_over_median"] == pytest.approx(0.95 / 0.35)
    assert row["slowest_rank"] == 1


def test_rounds_of_round_based_algorithms(tmp_path):
    rounds = [0, 0, 0, 1, 1, 1]
    rows = {r: make_rank(6, {"compute": 0.1, "wait": 0.3}, local_steps=3, rounds=rounds)
            for r in range(2)}
    path = write_file(tmp_path / "ls.h5", algorithm="localsgd", world_size=2, wall=4.0,
                      steps_per_rank=6, rank_rows=rows)
    (row,) = _rows([path])
    assert row["rounds"] == 2
    assert row["exposed_comm_s_per_round"] == pytest.approx(6 * 0.3 / 2)


# ---------------------------------------------------------------- the report command


_report = report_cli


def test_report_json_keeps_old_keys_and_adds(scaling_files, capsys):
    rc, out, err = _report(*scaling_files, "--format", "json", capsys=capsys)
    assert rc == 0, err
    data = json.loads(out)
    old = json.loads(format_report(report_rows(scaling_files), "json"))
    assert len(data) == len(old) == len(scaling_files)
    for obj, before in zip(data, old, strict=True):
        assert list(obj)[: len(schema.REPORT_KEYS) + 1] == [*schema.REPORT_KEYS, "path"]
        assert {k: obj[k] for k in before} == before  # old keys, old values
        assert set(row_keys()) <= set(obj)
        assert isinstance(obj["ranks"], list) and len(obj["ranks"]) == obj["world_size"]
    rc, out, err = _report(*scaling_files, "--format", "json", "--by", "algorithm,world_size",
                           capsys=capsys)
    groups = json.loads(out)
    assert rc == 0 and len(groups) == 6
    for obj in groups:
        assert list(obj)[: len(schema.REPORT_KEYS) + 1] == [*schema.REPORT_KEYS, "path"]
        assert isinstance(obj["path"], list)
    assert groups[4]["wall_s_min"] == 4.0 and groups[4]["repeats"] == 3


def test_report_csv_and_md(scaling_files, capsys):
    rc, out, _ = _report(*scaling_files, "--format", "csv", "--by", "algorithm,world_size",
                         capsys=capsys)
    assert rc == 0
    records = list(csv.DictReader(io.StringIO(out)))
    assert list(records[0])[: len(schema.REPORT_KEYS) + 1] == [*schema.REPORT_KEYS, "path"]
    assert float(records[4]["speedup"]) == pytest.approx(1.6)
    assert records[4]["path"].count(";") == 2
    rc, out, _ = _report(*scaling_files, "--by", "algorithm,world_size", capsys=capsys)
    assert rc == 0
    for title in ("## Runs grouped by algorithm, world_size", "## Spread over repeats",
                  "## Time per phase", "## Stragglers", "## Scaling and communication"):
        assert title in out
    assert not re.search(r"\bnan\b", out.lower())  # a NaN printed (not "provenance")
    rc, out, _ = _report(*scaling_files[:2], "--per-rank", capsys=capsys)
    assert rc == 0 and "## Per rank: " in out and "| strong0.h5" in out


def test_report_partial_and_bad_files(tmp_path, scaling_files, capsys):
    partial = write_file(tmp_path / "partial.h5", algorithm="ssgd", world_size=2, wall=3.0,
                         steps_per_rank=4, complete=False,
                         rank_rows={0: make_rank(4, {"compute": 0.1})})
    rc, out, err = _report(partial, scaling_files[0], "--format", "json", capsys=capsys)
    assert rc == 0
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and partial in warnings[0] and "partial" in warnings[0]
    data = json.loads(out)
    assert data[0]["complete"] is False and data[1]["complete"] is True
    rc, out, err = _report(partial, capsys=capsys)
    assert rc == 0 and "| partial (recovered) |" in out
    other = tmp_path / "other.h5"
    import h5py

    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "syncbench/0"
    rc, out, err = _report(str(other), *scaling_files, capsys=capsys)
    assert rc == 2 and out == ""
    assert err.strip() == (f"syncbench report: {other} has schema 'syncbench/0', "
                           f"expected '{schema.SCHEMA}'")
    rc, _, err = _report(*scaling_files, "--by", "nosuchkey", capsys=capsys)
    assert rc == 2 and "nosuchkey" in err and len(err.strip().splitlines()) == 1


def test_plots_need_matplotlib(scaling_files, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc, out, err = _report(*scaling_files, "--plots", str(tmp_path / "p"), capsys=capsys)
    assert rc == 2 and out == ""
    assert "pip install syncbench[plot]" in err and not (tmp_path / "p").exists()


def test_local_step_plot_of_hand_made_oscars(tmp_path):
    pytest.importorskip("matplotlib")
    taus = {0: [4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8], 1: [4, 4, 4, 4, 4, 4, 4, 4]}
    rows = {}
    for r, tau in taus.items():
        rounds = [0] * 4 + [1] * (len(tau) - 4)
        rows[r] = make_rank(len(tau), {"compute": 0.1 * (r + 1)}, rounds=rounds)
        rows[r]["local_steps"] = np.asarray(tau)
    path = write_file(tmp_path / "osc.h5", algorithm="oscars", world_size=2, wall=2.0,
                      steps_per_rank=0, rank_rows=rows)
    run = read_run(path)
    assert plots.has_local_steps(run)
    png = Path(plots.plot_local_steps(pyplot(), run, tmp_path / "osc_local_steps.png"))
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert plots.default_window(run) == (2, 10)  # 8 steps from the middle of rank 0's 12


# ---------------------------------------------------------------- trace parsing


def test_parse_steps():
    assert parse_steps("2:5") == (2, 5)
    assert parse_steps("3:") == (3, None)
    assert parse_steps(":4") == (0, 4)
    assert parse_steps(None) is None
    for bad in ("5:2", "a:b", "1", "-1:3", "1:2:3"):
        with pytest.raises(ValueError, match="--steps"):
            parse_steps(bad)


def test_trace_layout_hand_made(tmp_path):
    from syncbench.analysis.trace import step_order

    path = write_file(tmp_path / "t.h5", algorithm="odsgd", world_size=2, wall=4.0,
                      steps_per_rank=4, rank_rows={0: make_rank(4, PH0),
                                                   1: make_rank(4, PH1)})
    run = read_run(path)
    trace = trace_events(run)
    order = step_order(run.attrs)
    assert order == ("data", "compute", "delay", "codec", "comm", "wait", "update")
    phases = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    # zero-length phases are left out: rank 0 has no delay, rank 1 no wait
    assert len(phases) == 2 * 4 * 5 and len(steps) == 2 * 4
    for e in phases:
        cols = run.ranks[e["pid"]]
        i = e["args"]["step"]
        k = order.index(e["name"])
        before = sum(cols[f"t_{p}"][i] for p in order[:k])
        assert e["ts"] == pytest.approx((cols["t_start"][i] + before) * 1e6)
        assert e["dur"] == pytest.approx(cols[f"t_{e['name']}"][i] * 1e6)
        assert e["dur"] > 0
    for rank in (0, 1):  # in the order they ran, back to back, inside their step
        mine = sorted((e for e in phases if e["pid"] == rank), key=lambda e: e["ts"])
        names = [e["name"] for e in mine[:5]]
        assert names == [p for p in order if (PH0 if rank == 0 else PH1).get(p)]
        for a, b in zip(mine, mine[1:]):
            assert round((a["ts"] + a["dur"]) * 1000) <= round(b["ts"] * 1000)  # whole ns
        for st in (e for e in steps if e["pid"] == rank):
            inner = [e for e in mine if e["args"]["step"] == st["args"]["step"]]
            assert st["ts"] == inner[0]["ts"]
            assert st["ts"] + st["dur"] == pytest.approx(inner[-1]["ts"] + inner[-1]["dur"])
            assert st["name"] == f"step {st['args']['step']}"
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    # evaluations after steps 1 and 3 of rank 0 (eval.step = 2, 4), at those steps' ends
    assert [e["ts"] for e in instants] == pytest.approx([2 * 0.55e6, 4 * 0.55e6])
    assert [e["args"]["accuracy"] for e in instants] == [0.5, 0.9]
    assert {e["cat"] for e in instants} == {"eval"}


def test_trace_integer_ns_boundaries_and_asgd_snapshots(tmp_path):
    from syncbench.analysis.trace import phase_bounds_ns

    # phase seconds whose float sums do not add up exactly
    cols = make_rank(50, {"data": 1e-4 / 3, "compute": 0.1 / 7, "comm": 2e-5 / 3,
                          "update": 1e-3 / 9}, step_time=0.1 / 7 + 1e-3 / 9 + 1e-4 / 3 + 2e-5 / 3)
    bounds = phase_bounds_ns(cols)
    assert bounds.dtype == np.int64
    assert np.all(np.diff(bounds, axis=1) >= 0)
    assert np.all(bounds[1:, 0] >= bounds[:-1, -1])  # steps never overlap
    path = write_file(tmp_path / "a.h5", algorithm="asgd", world_size=1, wall=1.0,
                      steps_per_rank=50, rank_rows={0: cols})
    trace = trace_events(read_run(path))
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert {e["cat"] for e in instants} == {"snapshot"}  # not drawn as pauses
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] > 0
            assert abs(e["ts"] * 1000 - round(e["ts"] * 1000)) < 1e-6  # whole nanoseconds


# ---------------------------------------------------------------- real runs


# ---------------------------------------------------------------- machine context


def test_machine_context_and_line():
    from syncbench.analysis.context import format_context, format_contexts, machine_context

    attrs = {"host_cores": 2, "host_cpus": 2, "world_size": 4, "hostnames": ["h"],
             "ranks_per_host": 4, "oversubscribed": True,
             "config": {"slowdown": "1,1,1,4", "slowdown_mode": "work"}}
    ctx = machine_context(attrs)
    assert ctx["ranks_per_core"] == 2.0 and ctx["oversubscribed"] is True
    assert format_context(ctx) == ("machine: 2 cores (2 CPUs), 4 ranks on 1 host, "
                                   "2.0 ranks/core, oversubscribed, slowdown mode work")
    # derived when only the host names are recorded; an old file says "unknown"
    two = machine_context({"host_cores": 2, "world_size": 2, "hostnames": ["h"]})
    assert two["ranks_per_host"] == 2 and two["oversubscribed"] is False
    assert format_context(machine_context({})) == "machine: cores unknown, " \
        "oversubscription unknown"
    # several nodes: "N nodes" (recorded, else the host names), never "1 host"
    nodes = machine_context({"host_cores": 2, "host_cpus": 2, "world_size": 4,
                             "hostnames": ["n0", "n1"], "nodes": 2, "ranks_per_node": [2, 2],
                             "ranks_per_host": 2, "oversubscribed": False})
    assert nodes["hosts"] == 2 and nodes["ranks_per_core"] == 1.0
    assert format_context(nodes) == ("machine: 2 cores (2 CPUs) per node, 4 ranks on 2 nodes "
                                     "(2 ranks/node), 1.0 ranks/core, not oversubscribed")
    old = machine_context({"host_cores": 2, "world_size": 3, "hostnames": ["n0", "n1", "n2"]})
    assert "3 ranks on 3 nodes (1 rank/node)" in format_context(old)
    merged = format_contexts([machine_context({"world_size": 2, "hostnames": ["h"]}), nodes])
    assert "on 1-2 nodes" in merged and "host" not in merged


def test_transport_env_keeps_the_transport_choices_and_merges_per_rank():
    from syncbench.analysis.context import merge_transport_env, transport_env

    env = {"UCX_TLS": "tcp", "MPIR_CVAR_CH4_NETMOD": "ofi", "OMPI_MCA_btl": "^vader",
           "OMPI_MCA_num_procs": "2", "OMPI_MCA_PREFIXES": "mca,opal", "PATH": "/bin",
           "FI_PROVIDER": "tcp", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
    assert transport_env(env) == {
        "FI_PROVIDER": "tcp", "MPIR_CVAR_CH4_NETMOD": "ofi", "OMPI_MCA_btl": "^vader",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "UCX_TLS": "tcp"}
    merged = merge_transport_env([{"UCX_TLS": "tcp", "FI_PROVIDER": "tcp"},
                                  {"UCX_TLS": "tcp"}, {"UCX_TLS": "sm"}])
    assert merged == {"FI_PROVIDER": ["tcp", None, None], "UCX_TLS": ["tcp", "tcp", "sm"]}
    assert merge_transport_env([{"UCX_TLS": "tcp"}] * 2) == {"UCX_TLS": "tcp"}
    assert merge_transport_env([{}, {}]) == {}


def test_overlapping_runs_need_a_shared_host_and_intersecting_intervals():
    from syncbench.analysis.context import overlapping_runs

    def attrs(t0, t1, host="h"):
        return {"hostnames": [host], "t_begin_unix": t0, "t_end_unix": t1}

    runs = [attrs(0, 2), attrs(1, 3), attrs(3.5, 4), attrs(0, 9, host="other"),
            {"hostnames": ["h"]}]
    assert overlapping_runs(runs) == [(0, 1)]
    assert overlapping_runs([attrs(0, 2), attrs(2, 3)]) == [(0, 1)]  # closed intervals


# ---------------------------------------------------------------- definitions


@pytest.mark.parametrize("busy, expected", [
    ([2.258, 7.622], 7.622 / 2.258),         # 2 ranks: the 3.38x case (a median of all: 1.54)
    ([1.0, 1.0, 4.0], 4.0),                  # 3 ranks, one 4x slower
    ([1.0, 1.0, 1.0, 4.0], 4.0),             # 4 ranks, one 4x slower
    ([1.0, 2.0, 3.0, 4.0], 4.0 / 2.0),       # 4 ranks: median of 1, 2, 3
    ([1.0, 1.0], 1.0),
    ([1.0], math.nan),
])
def test_straggler_ratio_is_max_over_median_of_the_others(busy, expected):
    from syncbench.analysis.run_metrics import straggler_ratio

    value = straggler_ratio(busy)
    assert (math.isnan(value) and math.isnan(expected)) or value == pytest.approx(expected)


def test_straggler_ratio_of_a_run_at_two_ranks(tmp_path):
    rows = {0: make_rank(4, {"compute": 0.002258, "wait": 0.005}),
            1: make_rank(4, {"compute": 0.002, "delay": 0.005622})}
    path = write_file(tmp_path / "s.h5", algorithm="ssgd", world_size=2, wall=1.0,
                      steps_per_rank=4, rank_rows=rows)
    (row,) = _rows([path])
    assert row["busy_max_over_median"] == pytest.approx(7.622 / 2.258)
    assert round(row["busy_max_over_median"], 2) == 3.38 and row["slowest_rank"] == 1


def test_hidden_comm_from_step_time_excludes_warmup(tmp_path):
    from syncbench.analysis.hidden_comm import hidden_communication, steady_step_times

    # OD-SGD: 2 blocking warm-up steps (1.0 s, 0.5 s of it sync) then 4 steps of 0.7 s
    # whose compute slowed under overlap; the blocking reference steps in 0.8 s (0.4 sync).
    def od_rank():
        cols = make_rank(6, {"compute": 0.5, "comm": 0.2})
        cols["t_compute"][:2], cols["t_wait"][:2] = 0.5, 0.3
        return cols

    od = write_file(tmp_path / "od.h5", algorithm="odsgd", world_size=2, wall=5.0,
                    steps_per_rank=6, rank_rows={0: od_rank(), 1: od_rank()},
                    root={"warmup_steps": 2})
    ref = write_file(tmp_path / "ref.h5", algorithm="ssgd", world_size=2, wall=5.0,
                     steps_per_rank=6, phases={"compute": 0.4, "comm": 0.4},
                     config={"comm": "blocking"})
    od_run, ref_run = read_run(od), read_run(ref)
    assert steady_step_times(od_run) == (pytest.approx(0.7), pytest.approx(0.2), 8)
    assert hidden_communication(od_run, [ref_run]) == pytest.approx((0.8 - 0.7) / 0.4)
    row, ref_row = _rows([od, ref])
    assert row["warmup_steps"] == 2 and row["hidden_comm_fraction"] == pytest.approx(0.25)
    assert ref_row["hidden_comm_fraction"] == 0.0
    # another MPI library is another scenario: no reference
    other = write_file(tmp_path / "ompi.h5", algorithm="odsgd", world_size=2, wall=5.0,
                       steps_per_rank=6, root={"mpi_library": "Open MPI v5.0.8"})
    assert math.isnan(_rows([other, ref])[0]["hidden_comm_fraction"])


def test_series_keep_unlike_runs_apart(tmp_path):
    """MPI library, slowdown and budget each start a series of their own."""
    def run(name, n, wall, **kw):
        return write_file(tmp_path / f"{name}.h5", algorithm="ssgd", world_size=n, wall=wall,
                          steps_per_rank=64 // n, **kw)

    paths = [run("m1", 1, 4.0), run("m2", 2, 2.5),
             run("o2", 2, 2.0, root={"mpi_library": "Open MPI v5.0.8"}),
             run("s2", 2, 3.0, config={"slowdown": "1,4"}),
             run("e2", 2, 1.0, config={"epochs": 0.5})]
    rows = _rows(paths)
    assert len({r["series"] for r in rows}) == 4
    assert rows[1]["speedup"] == pytest.approx(4.0 / 2.5)
    assert rows[0]["scaling"] == rows[1]["scaling"] == "strong"
    for row in rows[2:]:  # a single world size each: no speedup, no efficiency
        assert math.isnan(row["speedup"]) and math.isnan(row["efficiency"])
        assert row["scaling"] is None
    assert "mpi_library=Open MPI v5.0.8" in rows[2]["series"]


def test_recorded_weak_mode_keys_on_budget_per_rank(tmp_path):
    # weak: epochs grow with N (0.5 per rank), per-rank batch fixed, steps per rank equal
    paths = [write_file(tmp_path / f"w{n}.h5", algorithm="ssgd", world_size=n, wall=wall,
                        steps_per_rank=16, config={"epochs": 0.5 * n},
                        root={"scaling_mode": "weak"})
             for n, wall in ((1, 2.0), (2, 2.5), (4, 4.0))]
    rows = _rows(paths)
    assert len({r["series"] for r in rows}) == 1
    assert [r["scaling"] for r in rows] == ["weak"] * 3
    assert [round(r["efficiency"], 9) for r in rows] == [1.0, 0.8, 0.5]
    # recorded weak but the samples say otherwise: mixed, no speedup
    bad = write_file(tmp_path / "bad.h5", algorithm="ssgd", world_size=2, wall=1.0,
                     steps_per_rank=8, config={"epochs": 1.0}, root={"scaling_mode": "weak"})
    rows = _rows([paths[0], bad])
    assert rows[1]["scaling"] == "mixed" and math.isnan(rows[1]["speedup"])


def test_overlapping_runs_are_flagged_and_get_no_speedup(tmp_path):
    def run(name, n, t0, t1):
        return write_file(tmp_path / f"{name}.h5", algorithm="ssgd", world_size=n,
                          wall=4.0 / n, steps_per_rank=64 // n,
                          root={"hostnames": ["node0"], "t_begin_unix": t0, "t_end_unix": t1})

    paths = [run("a", 1, 100.0, 110.0), run("b", 2, 105.0, 112.0), run("c", 4, 200.0, 210.0)]
    rows = _rows(paths)
    assert [r["overlapped"] for r in rows] == [True, True, False]
    assert rows[0]["overlaps_with"] == ["b.h5"]
    assert all(math.isnan(r["speedup"]) for r in rows)  # no clean baseline pair left
    rows = _rows([*paths, run("d", 1, 300.0, 310.0)])
    assert math.isnan(rows[1]["speedup"]) and rows[2]["speedup"] == pytest.approx(4.0)


def test_diverged_run_gets_no_ratio(tmp_path):
    import h5py

    paths = [write_file(tmp_path / f"d{n}.h5", algorithm="ssgd", world_size=n, wall=4.0 / n,
                        steps_per_rank=64 // n) for n in (1, 2)]
    with h5py.File(paths[1], "r+") as f:
        f["summary"].attrs["diverged"] = True
    rows = _rows(paths)
    assert rows[1]["diverged"] is True and math.isnan(rows[1]["speedup"])


def test_report_md_context_sync_first_and_flags(tmp_path, capsys):
    import h5py

    def run(name, n, **kw):
        return write_file(tmp_path / f"{name}.h5", algorithm="ssgd", world_size=n,
                          wall=4.0 / n, steps_per_rank=64 // n, target=0.8,
                          evals=make_evals(times=(0.5, 1.0, 1.5), accuracy=(0.5, 0.85, 0.9),
                                           samples=(1, 2, 3), steps=(1, 2, 3)),
                          root={"host_cores": 2, "host_cpus": 2, "hostnames": ["h"],
                                "ranks_per_host": n, "oversubscribed": n > 2}, **kw)

    paths = [run("a1", 1), run("a4", 4), run("solo", 2, config={"slowdown": "1,4"})]
    with h5py.File(paths[1], "r+") as f:
        f["summary"].attrs["diverged"] = True
    rc, out, err = _report(*paths, capsys=capsys)
    assert rc == 0, err
    assert out.count("machine: 2 cores (2 CPUs), 1-4 ranks on 1 host, 0.5-2.0 ranks/core, "
                     "some oversubscribed") == 4  # above every table
    header = next(ln for ln in out.splitlines() if ln.startswith("| run "))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[3:6] == ["sync", "time_to_target_s", "eval every s"]
    a4 = next(ln for ln in out.splitlines() if ln.startswith("| a4.h5"))
    cells = [c.strip() for c in a4.strip("|").split("|")]
    assert cells[4] == cells[11] == cells[12] == "diverged"  # time to target, speedup, eff.
    assert cells[-1] == "diverged, oversubscribed"
    a1 = next(ln for ln in out.splitlines() if ln.startswith("| a1.h5"))
    cells = [c.strip() for c in a1.strip("|").split("|")]
    assert cells[11] == cells[12] == "-"  # the only clean world size: no speedup
    rc, out, _ = _report(*paths, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert data[1]["diverged"] is True and data[1]["speedup"] is None
    assert data[0]["machine"].startswith("machine: 2 cores (2 CPUs), 1 rank on 1 host")


@pytest.mark.slow
def test_plots_skip_scaling_without_two_world_sizes_and_flat_local_steps(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    paths = [write_file(tmp_path / f"n4-{a}.h5", algorithm=a, world_size=4, wall=1.0,
                        steps_per_rank=8) for a in ("ssgd", "asgd")]
    paths.append(write_file(tmp_path / "ls1.h5", algorithm="localsgd", world_size=1, wall=1.0,
                            steps_per_rank=8, rank_rows={0: make_rank(8, {"compute": 0.01},
                                                                      local_steps=4)}))
    out = tmp_path / "plots"
    rc, _, err = _report(*paths, "--plots", str(out), "--plot-format", "png",
                         "--per-run-plots", capsys=capsys)
    assert rc == 0, err
    assert not (out / "scaling.png").exists() and not (out / "ls1_local_steps.png").exists()
    notes = [ln for ln in err.splitlines() if "skipped" in ln]
    assert any(ln.startswith("syncbench report: note: scaling plot skipped: no series has a "
                             "speedup at two or more world sizes") for ln in notes)
    assert any("local-step schedule plot skipped at N=1" in ln and "ls1.h5" in ln
               for ln in notes)
    assert (out / "convergence.png").read_bytes()[:8] == PNG_MAGIC


def test_convergence_median_band_over_repeats():
    from syncbench.analysis.plots import median_band

    curves = [(np.array([0.0, 1.0, 2.0]), np.array([0.1, 0.5, 0.7])),
              (np.array([0.0, 1.0, 2.0]), np.array([0.3, 0.6, 0.9])),
              (np.array([0.0, 1.0, 2.0]), np.array([0.1, 0.1, 0.1]))]
    grid, med, lo, hi = median_band(curves, points=3)
    assert list(grid) == [0.0, 1.0, 2.0]
    assert list(med) == [0.1, 0.5, 0.7] and list(lo) == [0.1, 0.1, 0.1]
    assert list(hi) == [0.3, 0.6, 0.9]  # the median curve, not the fastest or best repeat


def test_report_on_a_simulated_run_without_evaluations(tmp_path, capsys):
    empty = {"t": np.zeros(0), "step": np.zeros(0, dtype=int),
             "samples_seen": np.zeros(0, dtype=int), "loss": np.zeros(0),
             "accuracy": np.zeros(0)}
    paths = [write_file(tmp_path / f"sim{n}.h5", algorithm="oscars", world_size=n,
                        wall=4.0 / n, steps_per_rank=64 // n, evals=empty,
                        ) for n in (2, 8)]
    import h5py

    for path in paths:  # the simulator's root attribute
        with h5py.File(path, "r+") as f:
            f.attrs["simulated"] = True
    rc, out, err = _report(*paths, "--plots", str(tmp_path / "plots"), capsys=capsys)
    assert rc == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("| sim8.h5"))
    assert "simulated" in row and "4.00" in row  # 4x the ranks, 4x the samples/s
    assert "convergence plot skipped" in err
    rc, out, _ = _report(*paths, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert data[0]["final_accuracy"] is None and data[0]["simulated"] is True


def test_group_time_to_target_counts_a_diverged_run_as_never(tmp_path):
    import h5py

    paths = [write_file(tmp_path / f"r{i}.h5", algorithm="asgd", world_size=2, wall=3.0,
                        steps_per_rank=4, evals=make_evals(accuracy=(0.9, 0.9)), target=0.8)
             for i in range(2)]
    with h5py.File(paths[0], "r+") as f:  # reached the target at t=1, then diverged
        f["summary"].attrs["diverged"] = True
    (g,) = group_rows(_rows(paths, by=("algorithm",)), ("algorithm",))
    assert g["diverged"] == 1 and g["repeats"] == 2
    assert math.isnan(g["time_to_target_s"]) and math.isnan(g["time_to_target_s_max"])
    assert g["time_to_target_s_min"] == 1.0


def _flag_diverged(path: str, value: bool | None) -> None:
    """Set (or, with None, delete as in files older than the flag) ``/summary`` diverged."""
    import h5py

    with h5py.File(path, "r+") as f:
        if value is None:
            del f["summary"].attrs["diverged"]
        else:
            f["summary"].attrs["diverged"] = value


def test_hidden_comm_only_for_ssgd_and_odsgd_runs_that_count(tmp_path):
    ref = write_file(tmp_path / "ref.h5", algorithm="ssgd", world_size=2, wall=4.0,
                     steps_per_rank=4, phases={"compute": 0.2, "comm": 0.25},
                     config={"comm": "blocking"})
    fast = {"compute": 0.2, "comm": 0.05}
    paths = [ref] + [write_file(tmp_path / f"{a}{i}.h5", algorithm=a, world_size=2, wall=4.0,
                                steps_per_rank=4, phases=fast)
                     for i, a in enumerate(("odsgd", "odsgd", "localsgd", "asgd"))]
    _flag_diverged(paths[2], True)
    _, od, od_div, local, asgd = _rows(paths)
    assert od["hidden_comm_fraction"] == pytest.approx((0.45 - 0.25) / 0.25)
    for row in (od_div, local, asgd):  # diverged; communicates less by design
        assert math.isnan(row["hidden_comm_fraction"])


def test_hidden_comm_references_share_the_node_speeds(tmp_path):
    """A node slowed by a CPU quota has no train flag: the blocking reference of a run on
    it is a blocking run on the same slowed node, not a homogeneous one."""
    slow = {1: {"node_speed": 0.25}}
    hom_ref = write_file(tmp_path / "hom.h5", algorithm="ssgd", world_size=2, wall=4.0,
                         steps_per_rank=4, phases={"compute": 0.2, "comm": 0.25},
                         config={"comm": "blocking"})
    slow_ref = write_file(tmp_path / "slow.h5", algorithm="ssgd", world_size=2, wall=8.0,
                          steps_per_rank=4, phases={"compute": 0.2, "comm": 0.8},
                          config={"comm": "blocking"}, rank_extra=slow)
    od = write_file(tmp_path / "od.h5", algorithm="odsgd", world_size=2, wall=8.0,
                    steps_per_rank=4, phases={"compute": 0.2, "comm": 0.6}, rank_extra=slow)
    hom, slow_row, od_row = _rows([hom_ref, slow_ref, od])
    assert hom["hidden_comm_fraction"] == 0.0 and slow_row["hidden_comm_fraction"] == 0.0
    assert od_row["hidden_comm_fraction"] == pytest.approx((1.0 - 0.8) / 0.8)


def test_group_samples_per_s_leave_diverged_runs_out(tmp_path):
    # walls 1, 2, 4: the diverged run (wall 1) would be the fastest
    paths = [write_file(tmp_path / f"r{i}.h5", algorithm="oscars", world_size=2, wall=w,
                        steps_per_rank=8) for i, w in enumerate((1.0, 2.0, 4.0))]
    _flag_diverged(paths[0], True)
    (g,) = group_rows(_rows(paths), ("algorithm",))
    assert g["diverged"] == 1
    assert g["samples_per_s"] == pytest.approx(2 * 8 * BATCH * (1 / 2 + 1 / 4) / 2)
    assert g["samples_per_s_max"] == pytest.approx(2 * 8 * BATCH / 2.0)
    for p in paths[1:]:
        _flag_diverged(p, True)
    (g,) = group_rows(_rows(paths), ("algorithm",))
    assert math.isnan(g["samples_per_s"])
    from syncbench.analysis.report import _cell
    assert _cell(g, "samples_per_s") == "diverged"


def test_tables_recompute_divergence_for_files_without_the_flag(tmp_path):
    path = write_file(tmp_path / "old.h5", algorithm="ssgd", world_size=2, wall=4.0,
                      steps_per_rank=4, root={"dataset": "mnist"},
                      evals=make_evals(accuracy=(0.3, 0.12)))
    _flag_diverged(path, None)
    (row,) = _rows([path])
    assert row["diverged"] is True  # final accuracy 0.12 <= 1.5 x 1/10


def test_host_cores_count_the_host_not_the_process_mask(tmp_path, monkeypatch):
    from syncbench.analysis import context

    root = tmp_path / "cpu"
    root.mkdir()
    (root / "online").write_text("0-3\n")
    for cpu, core in enumerate((0, 1, 0, 1)):  # 2 cores with 2 hyperthreads each
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text("0\n")
    assert context._physical_cores(root) == 2
    monkeypatch.setattr(context, "_CPU_ROOT", root)
    # Open MPI binds a rank to one core: its mask must not make the host 1 core
    monkeypatch.setattr(context.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    info = context.host_info()
    assert info["host_cores"] == 2 and info["host_cpus"] == 4


def test_loaded_flag_from_the_foreign_cpu_share():
    from syncbench.analysis.context import LOADED_SHARE, format_context, loaded, machine_context

    attrs = {"host_cores": 2, "world_size": 2, "hostnames": ["h"]}
    assert loaded(attrs) is None  # older files: no flag
    # older files with only the load average: no flag (the lagging rule is gone)
    assert loaded({**attrs, "load_begin": 3.5, "load_end": 4.0}) is None
    assert loaded({**attrs, "foreign_cpu_share": float("nan")}) is None  # no /proc/stat
    quiet = {**attrs, "load_begin": 3.5, "foreign_cpu_share": 0.03}
    assert machine_context(quiet)["loaded"] is False
    assert loaded({**attrs, "foreign_cpu_share": LOADED_SHARE + 0.01}) is True
    ctx = machine_context({**attrs, "load_begin": 0.5, "foreign_cpu_share": 0.45})
    assert ctx["loaded"] is True
    assert "other processes used 45% of the cores during the run" in format_context(ctx)


def _idle(busy: float, wall: float = 10.0, cpus: int = 2) -> tuple[dict, dict]:
    """Per-CPU idle seconds at two ends ``wall`` apart with ``busy`` CPU seconds between,
    spread evenly over ``cpus`` CPUs."""
    begin = {f"cpu{i}": 500.0 for i in range(cpus)}
    return begin, {cpu: idle + wall - busy / cpus for cpu, idle in begin.items()}


def test_foreign_cpu_is_host_busy_time_less_the_ranks_own():
    from syncbench.analysis.context import foreign_cpu

    def rec(host, own, busy=None, t=(0.0, 10.0), cores=2):
        idle = (None, None) if busy is None else _idle(busy, t[1] - t[0], cores)
        return {"host": host, "cores": cores,
                "begin": {"own_s": 1.0, "host_idle_s": idle[0], "t": t[0]},
                "end": {"own_s": 1.0 + own, "host_idle_s": idle[1], "t": t[1]}}

    # host a: 18 busy s, ranks used 8 + 6 -> 4 foreign; host b: 5 busy, 5 own -> 0
    out = foreign_cpu([rec("a", 8.0, busy=18.0), rec("a", 6.0),
                       rec("b", 5.0, busy=5.0, cores=4)])
    assert out["foreign_cpu_s"] == pytest.approx(4.0)
    assert out["foreign_cpu_share"] == pytest.approx(4.0 / (10 * 2 + 10 * 4))
    # clock-tick rounding below the ranks' own time is no negative foreign time
    assert foreign_cpu([rec("a", 8.0, busy=7.9)])["foreign_cpu_s"] == 0.0
    # a host without a /proc/stat reading: NaN, hence no flag
    assert math.isnan(foreign_cpu([rec("a", 8.0)])["foreign_cpu_share"])


def test_foreign_cpu_counts_nodes_of_one_kernel_once():
    """Emulated nodes (namespaces of one host) share one /proc/stat: each node's reading
    is the whole kernel's, so the nodes' ranks are one machine's, not another's load."""
    from syncbench.analysis.context import foreign_cpu

    begin, end = _idle(19.0)

    def rec(host, own):
        return {"host": host, "machine": "boot-1", "cores": 2,
                "begin": {"own_s": 0.0, "host_idle_s": begin, "t": 0.0},
                "end": {"own_s": own, "host_idle_s": end, "t": 10.0}}

    # 19 busy s on the one kernel, ranks on its two nodes used 10 + 9: nothing foreign
    out = foreign_cpu([rec("node1", 10.0), rec("node2", 9.0)])
    assert out["foreign_cpu_s"] == pytest.approx(0.0)
    assert out["foreign_cpu_share"] == pytest.approx(0.0)
    # by host name alone each node would count the other's 9-10 s as foreign
    by_name = [{**r, "machine": ""} for r in (rec("node1", 10.0), rec("node2", 9.0))]
    assert foreign_cpu(by_name)["foreign_cpu_s"] == pytest.approx(19.0)


def test_each_cpus_idle_time_is_read_from_proc_stat(tmp_path):
    from syncbench.analysis.context import host_cpu_idle_s

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 40 5 6 7 50 0\ncpu0 1 2 3 400 5 6 7 8 9 10\n"
                    "cpu1 1 2 3 600 15 6 7 8 9 10\nintr 5 6\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert host_cpu_idle_s(str(stat)) == pytest.approx({"cpu0": 405 / ticks,
                                                        "cpu1": 615 / ticks})
    assert host_cpu_idle_s(str(tmp_path / "missing")) is None


def test_a_cpus_busy_time_is_its_wall_less_its_idle_not_its_busy_ticks(tmp_path):
    """Measured on the emulated cluster (a KVM guest on an Intel Xeon, a node at speed
    0.5 on cpu1): over a run of 16.8 s cpu1's user ticks came to 8.39 s and system 1.17,
    with 13.37 s idle, 22.9 s in all; its processes had used 3.0 s. The busy ticks count
    5.4 s no process used; the wall less the idle time, 3.43 s, does not. cpu0 ran the
    whole time (no idle)."""
    from syncbench.analysis.context import busy_between, foreign_cpu, host_cpu_idle_s

    ticks = os.sysconf("SC_CLK_TCK")

    def stat(path, cpu0, cpu1):  # (user, system, idle) seconds of each CPU
        def line(name, cpu):
            user, system, idle = (round(x * ticks) for x in cpu)
            return f"{name} {user} 0 {system} {idle} 0 0 0 0 0 0\n"
        path.write_text(line("cpu0", cpu0) + line("cpu1", cpu1))
        return host_cpu_idle_s(str(path))

    begin = stat(tmp_path / "a", (100.0, 50.0, 1000.0), (80.0, 20.0, 1000.0))
    end = stat(tmp_path / "b", (111.02, 55.81, 1000.0), (88.39, 21.17, 1013.37))
    assert busy_between(begin, end, 16.8) == pytest.approx(16.8 + 3.43, abs=0.05)
    # the ranks: 16.4 s (the fast one, polling) and 3.04 s (at the quota)
    records = [{"host": "node1", "machine": "boot-1", "cores": 2,
                "begin": {"own_s": 0.0, "host_idle_s": begin, "t": 0.0},
                "end": {"own_s": 16.4, "host_idle_s": end, "t": 16.8}},
               {"host": "node2", "machine": "boot-1", "cores": 2,
                "begin": {"own_s": 0.0, "host_idle_s": None, "t": 0.0},
                "end": {"own_s": 3.04, "host_idle_s": None, "t": 16.8}}]
    share = foreign_cpu(records)["foreign_cpu_share"]
    assert share < 0.05, share  # the busy ticks would give (16.83 + 9.56 - 19.44) / 33.6


def test_busy_between_keeps_each_cpu_within_its_wall():
    from syncbench.analysis.context import busy_between

    begin = {"cpu0": 10.0, "cpu1": 10.0, "cpu2": 10.0}
    # cpu0 idle 2 of 5 s; cpu1's idle ran ahead of the wall; cpu2 went off line
    end = {"cpu0": 12.0, "cpu1": 16.0}
    assert busy_between(begin, end, 5.0) == pytest.approx(3.0)
    # an idle counter that went backwards is no more than the wall of busy time
    assert busy_between({"cpu0": 10.0}, {"cpu0": 9.0}, 5.0) == 5.0


def test_report_notes_a_loaded_run(tmp_path, capsys):
    ctx = {"host_cores": 2, "host_cpus": 2, "hostnames": ["h"], "ranks_per_host": 2}
    busy = write_file(tmp_path / "busy.h5", algorithm="ssgd", world_size=2, wall=2.0,
                      steps_per_rank=4, root={**ctx, "load_begin": 0.5, "load_end": 0.5,
                                              "foreign_cpu_s": 2.0, "foreign_cpu_share": 0.5})
    quiet = write_file(tmp_path / "quiet.h5", algorithm="ssgd", world_size=2, wall=2.0,
                       steps_per_rank=4, root={**ctx, "load_begin": 5.0, "load_end": 4.0,
                                               "foreign_cpu_s": 0.1, "foreign_cpu_share": 0.02})
    rows = _rows([busy, quiet])
    assert [r["loaded"] for r in rows] == [True, False]
    rc, out, err = _report(busy, quiet, capsys=capsys)
    assert rc == 0, err
    busy_line = next(ln for ln in out.splitlines() if "busy.h5" in ln)
    quiet_line = next(ln for ln in out.splitlines() if "quiet.h5" in ln)
    assert "loaded" in busy_line and "loaded" not in quiet_line
    assert "other processes used 50% of the cores during the run" in out
    assert "some runs loaded" in out
