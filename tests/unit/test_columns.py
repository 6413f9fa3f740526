"""The column registry: one entry puts a metric in every table.

A throwaway column is registered for the length of a test (``columns.registered``)
and must show up in ``syncbench report``'s Markdown, CSV and JSON (per run and per
group, with its spread) and in the runner's records, cells and comparison table,
with no other edit; then it must be gone again. Hand-made run files
(``bench.train.recorder.write_run_file``); serial pytest run.
"""

from __future__ import annotations

import csv
import io
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import report_cli

from syncbench.analysis import columns, schema
from syncbench.analysis.columns import Column, registered
from syncbench.analysis.hidden_comm import is_blocking_reference
from syncbench.analysis.repeats import column_spread, format_spread, spread
from syncbench.analysis.runfile import read_run
from syncbench.analysis.tables import table_rows
from syncbench.bench.experiment.aggregate import scenario_cells
from syncbench.bench.experiment.measure import run_figures
from syncbench.bench.experiment.print_tables import comparison_table
from syncbench.bench.experiment.scaling_table import scaling_table
from syncbench.bench.train.recorder import write_run_file

BATCH = 64
KEY = "probe_metric"
HEADER = "probe metric"


def _rank(steps: int) -> dict[str, np.ndarray]:
    cols = {"step": np.arange(steps), "t_start": np.arange(steps) * 0.01,
            **{f"t_{p}": np.full(steps, 0.01 if p == "compute" else 0.0)
               for p in schema.PHASES},
            "loss": np.linspace(2.0, 1.0, steps), "samples": np.full(steps, BATCH)}
    for name, dtype in schema.RANK_COLUMNS.items():
        cols.setdefault(name, np.zeros(steps, dtype=dtype))
    return cols


def _write(path, world_size: int, steps: int, seed: int, **extra) -> str:
    evals = {"t": np.array([0.5, 1.0]), "step": np.array([2, 4]),
             "samples_seen": np.array([256, 512]), "loss": np.array([1.0, 0.5]),
             "accuracy": np.array([0.6, 0.9])}
    root = {"algorithm": "ssgd", "model": "mlp", "dataset": "synthetic",
            "world_size": world_size, "buckets": 1,
            "config": {"algorithm": "ssgd", "batch_size": BATCH, "comm": "overlap",
                       "seed": seed, "target_accuracy": 0.8}, **extra}
    rows = {r: _rank(steps) for r in range(world_size)}
    attrs = {r: {"hostname": f"node{seed}-{r}", "slowdown": 1.0} for r in rows}
    write_run_file(path, root, rows, attrs, evals, 1.0 + seed, 0.8)
    return str(path)


@pytest.fixture
def run_files(tmp_path):
    """Two repeats at N = 1 and two at N = 2 (strong scaling, distinct hosts)."""
    return [_write(tmp_path / f"n{n}-r{r}.h5", n, 32 // n, r) for n in (1, 2) for r in (0, 1)]


def _probe() -> Column:
    """A new metric: N / wall time, right-aligned with 3 decimals, with a spread."""
    return Column(KEY, lambda f: f.run.world_size / f.row["wall_s"], "{:.3f}", spread=True,
                  tables=dict.fromkeys(columns.EVERY_TABLE, HEADER))


def _report(files, *flags, capsys):
    rc, out, err = report_cli(*files, *flags, capsys=capsys)
    assert rc == 0, err
    return out


def test_a_registered_column_is_in_every_report_format(run_files, capsys):
    with registered(_probe()):
        md = _report(run_files, capsys=capsys)
        first = md.split("## Time per phase")[0]
        header = next(ln for ln in first.splitlines() if ln.startswith("| run "))
        assert HEADER in header and header.index(HEADER) < header.index("note")
        assert "1.000" in first and "0.500" in first  # N = 1 at wall 1 s and at 2 s
        rows = list(csv.DictReader(io.StringIO(_report(run_files, "--format", "csv",
                                                       capsys=capsys))))
        assert [float(r[KEY]) for r in rows] == [1.0, 0.5, 2.0, 1.0]
        data = json.loads(_report(run_files, "--format", "json", capsys=capsys))
        assert list(data[0])[-3] == KEY  # after every older column, before ranks, machine
        groups = json.loads(_report(run_files, "--format", "json", "--by", "world_size",
                                    capsys=capsys))
        assert [(g[KEY], g[f"{KEY}_min"], g[f"{KEY}_max"]) for g in groups] == \
            [(0.75, 0.5, 1.0), (1.5, 1.0, 2.0)]
        grouped = _report(run_files, "--by", "world_size", capsys=capsys)
        assert HEADER in grouped.split("## Spread over repeats")[0]
    data = json.loads(_report(run_files, "--format", "json", capsys=capsys))
    assert KEY not in data[0] and columns.column(KEY) is None


def test_a_registered_column_is_in_the_runners_records_cells_and_table(run_files):
    runs = [read_run(p) for p in run_files]
    with registered(_probe()):
        figures = run_figures(runs, 0.8)
        assert [f[KEY] for f in figures] == [1.0, 0.5, 2.0, 1.0]
        assert list(figures[0])[-2:] == [KEY, "context"]
        records = [{"label": f"np{run.world_size}", "condition": "hom", "repeat": i % 2,
                    **fig} for i, (run, fig) in enumerate(zip(runs, figures, strict=True))]
        cells = scenario_cells(records, ["np1", "np2"], ["hom"], "np1")
        assert cells[1][KEY] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}
        lines = comparison_table("probe", "homogeneous", cells, "np1", 0.8,
                                 "time_to_target", [fig["context"] for fig in figures])
        header = next(ln for ln in lines if ln.startswith("# label"))
        assert HEADER in header and header.index(HEADER) < header.index("runs")
        row = next(ln for ln in lines if ln.startswith("  np2 "))
        assert "1.50 (1.00–2.00)" in row
    assert KEY not in run_figures(runs, 0.8)[0]


def test_a_registered_column_is_in_a_sweeps_scaling_table(run_files):
    runs = [read_run(p) for p in run_files]
    points = [SimpleNamespace(algorithm="ssgd", np=run.world_size, path=run.path)
              for run in runs]
    with registered(_probe()):
        lines = scaling_table(points, table_rows(runs), "machine: test").splitlines()
        header = next(ln for ln in lines if ln.startswith("| series"))
        assert f"| {HEADER} | note |" in header
        rows = [ln for ln in lines if ln.startswith("| ssgd")]
        assert [ln.split("|")[-3].strip() for ln in rows] == ["0.750", "1.500"]
    assert HEADER not in scaling_table(points, table_rows(runs), "machine: test")


def test_a_column_is_registered_once():
    with registered(_probe()), pytest.raises(ValueError, match="registered already"), \
            registered(_probe()):
        pass
    assert columns.column(KEY) is None


def test_the_registry_starts_with_the_report_keys_and_places_every_table_column():
    keys = columns.row_keys()
    assert keys[:len(schema.REPORT_KEYS) + 1] == (*schema.REPORT_KEYS, "path")
    assert len(set(keys)) == len(keys)
    every = {c.key for c in columns.columns()}
    for name, order in columns.TABLE_ORDER.items():
        assert set(order) - {"*"} <= every, name
    assert [c.key for c in columns.table_columns("runner")][:3] == \
        ["sync_fraction", "time_to_target_s", "eval_interval_s"]
    assert columns.format_spec("speedup_min") == "{:.2f}"  # a spread takes its column's
    assert columns.format_spec("slowdown") == "{:g}"  # a per-rank key (a --by flag)
    assert columns.format_spec("some_flag_s") == "{:.3f}"  # by suffix


def test_median_min_max_over_repeats():
    assert spread([3.0, None, float("nan"), 1.0, math.inf, 2.0]) == \
        {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([1.0, math.inf], keep_inf=True)["max"] == math.inf
    assert spread([])["median"] is None
    # a time to target that was missed counts as infinitely slow, then shows as NaN
    med, lo, hi = column_spread([1.0, None, float("nan")], missing_is_slow=True)
    assert math.isnan(med) and lo == 1.0 and math.isnan(hi)
    assert column_spread([1.0, True, "x", 3.0]) == (2.0, 1.0, 3.0)  # labels are no values
    assert format_spread({"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}) == "2.00 (1.00–3.00)"
    assert format_spread({"median": 2.0, "min": 2.0, "max": 2.0, "n": 3}) == "2.00"
    assert format_spread({"median": None, "status": "diverged"}) == "diverged"


def test_the_blocking_reference_is_told_by_traits_and_the_runs_own_comm_flag():
    def row(algorithm: str, comm: str, own: list[str] | None) -> dict:
        attrs = {"algorithm": algorithm}
        if own is not None:
            attrs["strategy_flags"] = json.dumps(own)
        return {"_attrs": attrs, "_config": {"comm": comm}}

    assert is_blocking_reference(row("ssgd", "blocking", ["bucket_mb", "comm"]))
    assert is_blocking_reference(row("ssgd", "blocking", None))  # older files
    assert not is_blocking_reference(row("ssgd", "overlap", ["comm"]))
    # OD-SGD hides communication too, but --comm is not its flag
    assert not is_blocking_reference(row("odsgd", "blocking", ["local_lookahead"]))
    assert not is_blocking_reference(row("asgd", "blocking", None))  # hides nothing


def test_wire_bytes_per_sample_is_the_declared_bytes_over_a_ranks_batch(tmp_path):
    """A reducer's wire_bytes_per_step over the per-rank batch; absent where none is
    declared (0) rather than 0 bytes."""
    declared = read_run(_write(tmp_path / "c.h5", 2, 8, 0, wire_bytes_per_step=6400))
    undeclared = read_run(_write(tmp_path / "u.h5", 2, 8, 0, wire_bytes_per_step=0))
    figures = run_figures([declared, undeclared], 0.8)
    assert figures[0]["wire_bytes_per_sample"] == 6400 / BATCH
    assert math.isnan(figures[1]["wire_bytes_per_sample"])


def test_a_strategy_of_rounds_declares_its_rounds_bytes_over_its_steps(tmp_path):
    """Local SGD, SlowMo and DiLoCo send nothing per step but one round's bytes every
    outer_period_steps: bytes per sample is that over the round's samples (a rank's)."""
    rounds = read_run(_write(tmp_path / "r.h5", 2, 8, 0, wire_bytes_per_step=0,
                             wire_bytes_per_outer_step=6400, outer_period_steps=4))
    figures = run_figures([rounds], 0.8)
    assert figures[0]["wire_bytes_per_sample"] == 6400 / 4 / BATCH


def test_the_runner_hides_the_decentralized_and_wire_columns_where_no_run_has_them(run_files):
    """A scenario of SSGD-like runs without declared bytes on the wire or replicas shows no
    empty wire B/sample, consensus or worst own acc column (each is optional)."""
    runs = [read_run(p) for p in run_files]
    figures = run_figures(runs, 0.8)
    records = [{"label": f"np{run.world_size}", "condition": "hom", "repeat": i % 2, **fig}
               for i, (run, fig) in enumerate(zip(runs, figures, strict=True))]
    cells = scenario_cells(records, ["np1", "np2"], ["hom"], "np1")
    lines = comparison_table("probe", "homogeneous", cells, "np1", 0.8, "time_to_target",
                             [fig["context"] for fig in figures])
    header = next(ln for ln in lines if ln.startswith("# label"))
    for name in ("wire B/sample", "consensus", "worst own acc"):
        assert name not in header
