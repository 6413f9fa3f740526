"""The ``codec`` phase (run-file column ``t_codec``): a codec's encode, decode and sum of
codes timed apart from ``update``, and files written before the column still read.

A file without ``t_codec`` (an older train, or the column deleted here) reads with zeros
in its place in both rank layouts, and every reader of the rows (the report's tables,
the trace, the per-run plots, the simulator's workload and ``--validate``'s figures)
takes it as a run without a codec.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from helpers import report_cli

from syncbench.algorithms.timing import PhaseTimer
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, LOCK_STEP_ORDER, PHASES
from syncbench.analysis import schema
from syncbench.analysis.report import load_runs, report_tables
from syncbench.analysis.run_metrics import BUSY_PHASES
from syncbench.analysis.runfile import read_run
from syncbench.analysis.trace import trace_events
from syncbench.bench.train.recorder import write_run_file

STEPS = 8


def rank_rows(codec: float) -> dict[str, np.ndarray]:
    """8 steps of 0.1 s compute, 0.02 s update and ``codec`` s of codec, back to back."""
    cols = {name: np.zeros(STEPS, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
    step_s = 0.1 + 0.02 + codec
    cols.update(step=np.arange(STEPS), t_start=np.arange(STEPS) * step_s,
                t_compute=np.full(STEPS, 0.1), t_update=np.full(STEPS, 0.02),
                t_codec=np.full(STEPS, codec), loss=np.full(STEPS, 1.0),
                samples=np.full(STEPS, 64))
    return cols


def write(path, codec: float, layout: str = schema.RANK_LAYOUT_PACKED, old: bool = False,
          compress: str = "none") -> str:
    """A complete 2-rank SSGD file; ``old``: without ``t_codec``, as written before it."""
    attrs = {"algorithm": "ssgd", "model": "mlp", "dataset": "synthetic", "world_size": 2,
             "config": {"algorithm": "ssgd", "batch_size": 64, "compress": compress},
             "hostnames": ["h"]}
    evals = {"t": np.asarray([1.0]), "step": np.asarray([STEPS]),
             "samples_seen": np.asarray([1024]), "loss": np.asarray([0.5]),
             "accuracy": np.asarray([0.9])}
    wall = STEPS * (0.12 + codec)
    write_run_file(path, attrs, {0: rank_rows(codec), 1: rank_rows(codec)},
                   {r: {"slowdown": 1.0} for r in (0, 1)}, evals, wall, None, layout=layout)
    if old:
        with h5py.File(path, "r+") as f:
            names = [name for name in _datasets(f) if name.endswith("t_codec")]
            assert names
            for name in names:
                del f[name]
    return str(path)


def _datasets(f: h5py.File) -> list[str]:
    out: list[str] = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_codec_is_a_phase_of_its_own_in_every_step_order_and_timer():
    assert "codec" in PHASES and "t_codec" in schema.RANK_COLUMNS
    assert schema.RANK_COLUMN_DEFAULTS["t_codec"] == 0.0
    units, description = schema.RANK_COLUMN_INFO["t_codec"]
    assert units == "s" and description.startswith(
        "time encoding, decoding and summing compressed codes (--compress, --quantize, "
        "low-precision gossip")
    for order in (LOCK_STEP_ORDER, LOCAL_FIRST_ORDER):
        assert set(order) == set(PHASES)
        assert order.index("codec") == order.index("comm") - 1  # encoded, then sent
    assert "codec" in BUSY_PHASES
    timer = PhaseTimer()
    with timer.phase("update"):
        with timer.phase("codec"):
            pass
    assert timer.totals["codec"] >= 0.0 and set(timer.totals) == set(PHASES)


@pytest.mark.parametrize("layout", [schema.RANK_LAYOUT_PACKED, schema.RANK_LAYOUT_GROUPS])
def test_a_file_written_before_t_codec_reads_with_zeros(tmp_path, layout):
    old = read_run(write(tmp_path / "old.h5", 0.0, layout, old=True))
    new = read_run(write(tmp_path / "new.h5", 0.0, layout))
    for rank in (0, 1):
        assert old.ranks[rank]["t_codec"].dtype == np.float64
        np.testing.assert_array_equal(old.ranks[rank]["t_codec"], np.zeros(STEPS))
        for name in schema.RANK_COLUMNS:
            np.testing.assert_array_equal(old.ranks[rank][name], new.ranks[rank][name])


def test_the_report_of_an_old_file_is_that_of_a_run_without_a_codec(tmp_path, capsys):
    old = write(tmp_path / "old.h5", 0.0, old=True)
    new = write(tmp_path / "new.h5", 0.0)
    rows = report_tables(load_runs([old, new]))
    keys = [k for k in rows[1] if k.startswith(("codec_", "update_", "compute_", "busy"))]
    assert "codec_s_per_step" in keys
    for key in keys:
        assert rows[0][key] == rows[1][key], key
    assert rows[0]["codec_s_per_step"] == 0.0
    rc, out, err = report_cli(old, "--format", "md", capsys=capsys)
    assert rc == 0 and "Traceback" not in err, err
    rc, out, err = report_cli(old, "--format", "json", capsys=capsys)
    assert rc == 0, err
    assert json.loads(out)[0]["codec_s_per_step"] == 0.0


def test_the_report_counts_the_codec_as_its_own_phase_and_as_busy(tmp_path):
    plain, coded = (report_tables(load_runs([write(tmp_path / f"{c}.h5", c)]))[0]
                    for c in (0.0, 0.03))
    assert coded["codec_s_per_step"] == pytest.approx(0.03)
    assert coded["update_s_per_step"] == pytest.approx(plain["update_s_per_step"])
    assert coded["codec_fraction"] == pytest.approx(0.03 / 0.15)
    busy = [r["busy_s_per_step"] for r in coded["ranks"]]
    assert busy == pytest.approx([0.15, 0.15])


def test_the_trace_of_an_old_file_has_no_codec_and_a_new_one_places_it(tmp_path):
    old = trace_events(read_run(write(tmp_path / "old.h5", 0.0, old=True)))
    names = {e["name"] for e in old["traceEvents"] if e.get("cat") == "phase"}
    assert names == {"compute", "update"}
    new = trace_events(read_run(write(tmp_path / "new.h5", 0.03)))
    phases = [e for e in new["traceEvents"] if e.get("cat") == "phase"
              and e["pid"] == 0 and e["args"]["step"] == 1]
    assert [e["name"] for e in phases] == ["compute", "codec", "update"]


def test_the_per_run_plots_draw_an_old_file_and_label_the_codec(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from syncbench.analysis.plots import PHASE_COLORS, PHASE_NAMES, plot_phases

    assert set(PHASE_COLORS) == set(PHASES) == set(PHASE_NAMES)
    assert len(set(PHASE_COLORS.values())) == len(PHASES)
    for name, codec, old in (("old", 0.0, True), ("new", 0.03, False)):
        run = read_run(write(tmp_path / f"{name}.h5", codec, old=old))
        out = tmp_path / f"{name}-phases.png"
        plot_phases(plt, run, out)
        plt.close("all")
        assert out.stat().st_size > 0


def test_the_simulators_readers_take_an_old_file_as_one_without_a_codec(tmp_path):
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate.compressed import codec_cost
    from syncbench.bench.simulate.validate import row_figures
    from syncbench.bench.simulate.workload import from_run

    old = write(tmp_path / "old.h5", 0.0, old=True, compress="fp16")
    new = write(tmp_path / "new.h5", 0.03, compress="fp16")
    cfg = build_parser("simulate").parse_args(["simulate", "--compress", "fp16"])
    w_old, w_new = from_run(old), from_run(new)
    assert w_old.mean_codec_s == 0.0
    seconds, where = codec_cost(cfg, w_old)  # the codec is in the old file's update rows
    assert seconds == 0.0 and "measured update rows" in where
    assert w_new.mean_codec_s == pytest.approx(0.03)
    seconds, where = codec_cost(cfg, w_new)
    assert seconds == pytest.approx(0.03) and "mean t_codec" in where
    # data, compute, update only (the data's time between phases: float rounding, 0)
    np.testing.assert_allclose(w_old.rows, w_new.rows, rtol=0, atol=1e-12)
    # --validate's "other" column: data + update + codec, the same for both layouts of it
    m_old, m_new = row_figures(read_run(old).ranks), row_figures(read_run(new).ranks)
    assert m_old["other_ms"] == pytest.approx(20.0)
    assert m_new["other_ms"] == pytest.approx(50.0)
    assert m_new["compute_ms"] == m_old["compute_ms"] == pytest.approx(100.0)
    legacy = {r: {k: v for k, v in cols.items() if k != "t_codec"}
              for r, cols in read_run(old).ranks.items()}
    assert row_figures(legacy) == m_old  # rows without the column at all
