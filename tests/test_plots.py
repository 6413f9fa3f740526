"""The figures of ``--plots``: formats, resolution, per-run plots on request, the headline.

Hand-made run files (``test_analysis.write_file``) for the report's flags; the
runner's headline from a scenario's cells, made here with ``scenario_cells`` and
from the recorded golden scenario (``/work/golden/scen``: its results.json and run
files, copied, resumed with ``syncbench run --resume --plots``) when it is there.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import report_cli
from test_analysis import BATCH, PNG_MAGIC, write_file

from syncbench.analysis.headline import (
    headline_figure,
    headline_from_cells,
    headline_from_results,
    headline_from_rows,
)
from syncbench.analysis.runfile import read_run
from syncbench.analysis.tables import table_rows
from syncbench.bench.experiment.aggregate import scenario_cells

GOLDEN = Path("/work/golden")
SIGNATURES = {"png": PNG_MAGIC, "pdf": b"%PDF", "svg": b"<?xml"}
STEPS = 16  # per rank, BATCH samples each


@pytest.fixture
def two_strategies(tmp_path):
    """ssgd and asgd at N=2, homogeneous: asgd twice as fast (wall 1 s against 2 s)."""
    return [write_file(tmp_path / f"{a}.h5", algorithm=a, world_size=2, wall=wall,
                       steps_per_rank=STEPS) for a, wall in (("ssgd", 2.0), ("asgd", 1.0))]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_report_writes_the_summary_figures_in_each_format(two_strategies, tmp_path, capsys,
                                                          fmt):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--plot-format", fmt,
                            capsys=capsys)
    assert rc == 0, err
    # one N: no scaling figure; no per-run figure unless asked
    assert {p.name for p in out.iterdir()} == {f"headline.{fmt}", f"convergence.{fmt}"}
    for path in out.iterdir():
        data = path.read_bytes()
        assert data.startswith(SIGNATURES[fmt]), path.name
    if fmt == "svg":
        assert b"<svg" in (out / "headline.svg").read_bytes()[:2000]
    assert "wrote 2 plots" in err


def test_dpi_sets_the_png_size(two_strategies, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    sizes = {}
    for dpi in (50, 100):
        out = tmp_path / f"dpi{dpi}"
        rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--dpi", str(dpi),
                                capsys=capsys)
        assert rc == 0, err
        sizes[dpi] = _png_size(out / "headline.png")
    (w50, h50), (w100, h100) = sizes[50], sizes[100]
    assert abs(w100 - 2 * w50) <= 1 and abs(h100 - 2 * h50) <= 1
    assert w100 >= 1100  # at least 11 inches wide at 100 dpi


def test_per_run_plots_only_when_asked(two_strategies, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--per-run-plots",
                            capsys=capsys)
    assert rc == 0, err
    names = {p.name for p in out.iterdir()}
    assert names == {"headline.png", "convergence.png", "ssgd_phases.png", "ssgd_timeline.png",
                     "asgd_phases.png", "asgd_timeline.png"}


def test_bad_plot_flags_are_one_line(two_strategies, tmp_path, capsys):
    rc, out, err = report_cli(*two_strategies, "--per-run-plots", capsys=capsys)
    assert rc == 2 and out == ""
    assert err.strip() == "syncbench report: --per-run-plots needs --plots DIR"
    with pytest.raises(SystemExit):
        report_cli(*two_strategies, "--plots", str(tmp_path), "--dpi", "0", capsys=capsys)
    assert "--dpi: expected a positive integer, got '0'" in capsys.readouterr().err


def test_report_headline_is_ratio_to_the_baseline_median(two_strategies, tmp_path):
    runs = [read_run(p) for p in two_strategies]
    extra = write_file(tmp_path / "asgd-slow.h5", algorithm="asgd", world_size=2, wall=4.0,
                       steps_per_rank=STEPS, config={"slowdown": "1,2",
                                                     "slowdown_mode": "work"})
    ssgd_slow = write_file(tmp_path / "ssgd-slow.h5", algorithm="ssgd", world_size=2,
                           wall=8.0, steps_per_rank=STEPS,
                           config={"slowdown": "1,2", "slowdown_mode": "work"})
    runs += [read_run(extra), read_run(ssgd_slow)]
    head, why = headline_from_rows(table_rows(runs))
    assert head is not None, why
    assert head.baseline == "ssgd" and head.labels == ["ssgd", "asgd"]
    assert head.configurations == ["homogeneous", "slowdown 1,2 mode work"]
    sps = head.heights("samples_per_s")
    assert sps[("homogeneous", "asgd")] == pytest.approx(2.0)  # 1 s against 2 s
    assert sps[("homogeneous", "ssgd")] == pytest.approx(1.0)
    assert sps[("slowdown 1,2 mode work", "asgd")] == pytest.approx(2.0)  # 4 s against 8 s
    samples = 2 * STEPS * BATCH
    assert head.baseline_values["homogeneous"][1] == pytest.approx(samples / 2.0)


def test_report_headline_skipped_with_the_baseline_alone(tmp_path):
    path = write_file(tmp_path / "ssgd.h5", algorithm="ssgd", world_size=2, wall=1.0,
                      steps_per_rank=STEPS)
    head, why = headline_from_rows(table_rows([read_run(path)]))
    assert head is None and why.startswith("headline plot skipped: no configuration has the "
                                           "baseline (ssgd) and another strategy")


def _record(label: str, cond: str, repeat: int, ttt: float, sps: float,
            diverged: bool = False) -> dict:
    return {"label": label, "group": label, "condition": cond, "repeat": repeat,
            "time_to_target_s": ttt, "samples_per_s": sps, "diverged": diverged,
            "final_accuracy": 0.8, "wall_s": 1.0}


def _cells() -> list[dict]:
    records = []
    for r in range(3):
        records += [_record("ssgd", "hom", r, 10.0, 100.0),
                    _record("fast", "hom", r, [4.0, 5.0, 6.0][r], [200.0, 250.0, 300.0][r]),
                    _record("ssgd", "s1-4", r, 20.0, 60.0),
                    # one repeat of three never reaches the target: max inf, median 0.5
                    _record("fast", "s1-4", r, [8.0, 10.0, math.inf][r], 120.0),
                    _record("wild", "hom", r, math.inf, 90.0, diverged=True)]
    return scenario_cells(records, ["ssgd", "fast", "wild"], ["hom", "s1-4"], "ssgd")


def test_headline_bars_are_the_cells_medians():
    cells = _cells()
    titles = {"hom": "homogeneous", "s1-4": "slowdown 1,4 mode work"}
    head = headline_from_cells(cells, "ssgd", titles, "tiny", 0.8, 3)
    for cell in cells:
        for metric, key in (("time_to_target", "ttt_ratio"), ("samples_per_s", "sps_ratio")):
            bar = head.bar(metric, titles[cell["condition"]], cell["label"])
            stats = cell[key]
            if stats["status"] is None:
                assert bar.status is None and bar.median == stats["median"]
                assert (bar.low, bar.high) == (stats["min"], stats["max"])
            else:
                assert bar.status == stats["status"] and bar.median is None
    ttt = head.heights("time_to_target")
    assert ttt[("homogeneous", "fast")] == pytest.approx(0.5)
    assert ttt[("slowdown 1,4 mode work", "fast")] == pytest.approx(0.5)
    assert math.isinf(head.bar("time_to_target", "slowdown 1,4 mode work", "fast").high)
    assert ("homogeneous", "wild") not in ttt
    assert head.bar("samples_per_s", "homogeneous", "wild").status == "diverged"
    assert head.baseline_values["homogeneous"] == (10.0, 100.0)


def test_headline_of_results_json_reads_infinities_written_as_null(tmp_path):
    from syncbench.bench.experiment.runner import write_json

    cells = _cells()
    path = tmp_path / "results.json"
    write_json(path, {"scenario": {"name": "tiny", "baseline": "ssgd", "repeats": 3,
                                   "target_accuracy": 0.8},
                      "runs": [{"condition": "hom", "condition_title": "homogeneous"}],
                      "cells": cells})
    head = headline_from_results(json.loads(path.read_text()))
    bar = head.bar("time_to_target", "s1-4", "fast")  # no title recorded: the key
    assert bar.median == pytest.approx(0.5) and math.isinf(bar.high)
    assert head.heights("samples_per_s") == headline_from_cells(
        cells, "ssgd", {"hom": "homogeneous"}).heights("samples_per_s")


def _drawn_heights(fig) -> list[list[float]]:
    """The heights of the bars drawn in each panel."""
    import matplotlib.patches as mpatches

    return [sorted(p.get_height() for p in ax.patches if isinstance(p, mpatches.Rectangle))
            for ax in fig.axes]


def test_headline_figure_draws_the_bars_it_was_given():
    pytest.importorskip("matplotlib")
    from syncbench.analysis.plot_style import pyplot

    plt = pyplot()
    head = headline_from_cells(_cells(), "ssgd", {}, "tiny", 0.8, 3)
    fig = headline_figure(plt, head)
    drawn = _drawn_heights(fig)
    expected = [sorted(head.heights(m).values()) for m in ("time_to_target", "samples_per_s")]
    assert len(drawn) == 2 and all(d == pytest.approx(e) for d, e in zip(drawn, expected))
    assert expected == [[0.5, 0.5, 1.0, 1.0], [1.0, 1.0, 2.0, 2.5]]  # hand-computed
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "diverged" in texts  # the bar that is not drawn says why
    ylabels = [ax.get_ylabel() for ax in fig.axes]
    assert "time to target accuracy 0.8 / ssgd's" in ylabels[0] and "ratio" in ylabels[0]
    assert "samples/s / ssgd's" in ylabels[1]
    for ax in fig.axes:  # the baseline: a dashed line at 1.0 across the panel
        assert any(line.get_linestyle() == "--" and list(line.get_ydata()) == [1.0, 1.0]
                   for line in ax.lines)
    assert "median of 3 repeats" in fig.get_suptitle()
    plt.close(fig)


@pytest.fixture
def golden_copy(tmp_path):
    """The golden scenario's run files and results.json, copied (paths rewritten)."""
    scen = GOLDEN / "scen"
    if not (scen / "results.json").is_file() or not (GOLDEN / "golden.toml").is_file():
        pytest.skip("no recorded golden scenario at /work/golden")
    out = tmp_path / "scen"
    out.mkdir()
    for path in scen.glob("*.h5"):
        shutil.copy(path, out / path.name)
    text = (scen / "results.json").read_text().replace(str(scen), str(out))
    (out / "results.json").write_text(text)
    shutil.copy(GOLDEN / "golden.toml", tmp_path / "golden.toml")
    return tmp_path / "golden.toml", out


def test_runner_resume_writes_the_headline_of_its_cells(golden_copy, tmp_path):
    pytest.importorskip("matplotlib")
    scenario, out = golden_copy
    plots = tmp_path / "plots"
    proc = subprocess.run([sys.executable, "-m", "syncbench", "run", str(scenario),
                           "--out-dir", str(out), "--resume", "--plots", str(plots),
                           "--plot-format", "pdf"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("kept by --resume") == 20  # nothing ran again
    assert {p.name for p in plots.iterdir()} == {"headline.pdf", "convergence.pdf"}
    assert (plots / "headline.pdf").read_bytes().startswith(b"%PDF")
    results = json.loads((out / "results.json").read_text())
    head = headline_from_results(results)
    assert head.configurations == ["homogeneous", "slowdown 1,2 mode work"]
    for cell in results["cells"]:
        title = {"hom": "homogeneous"}.get(cell["condition"], "slowdown 1,2 mode work")
        bar = head.bar("samples_per_s", title, cell["label"])
        assert bar.median == cell["sps_ratio"]["median"]
