"""The figures of ``--plots``: formats, resolution, per-run plots on request, the headline,
and what makes them fit for a paper (vector by default, column widths, fonts of 8 pt
or more, a caption naming the experiment, whiskers only over repeats, flagged bars).

Hand-made run files (``test_analysis.write_file``) for the report's flags; the
runner's headline from a scenario's cells, made here with ``scenario_cells`` and
from the recorded golden scenario (``/work/golden/scen``: its results.json and run
files, copied, resumed with ``syncbench run --resume --plots``) when it is there.

Split off this module: ``tests/e2e/test_plots_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest
from helpers import report_cli
from test_analysis import BATCH, PNG_MAGIC, write_file

from syncbench.analysis.headline import (
    FLAGS,
    headline_figure,
    headline_from_cells,
    headline_from_results,
    headline_from_rows,
    headline_note,
)
from syncbench.analysis.runfile import read_run
from syncbench.analysis.tables import table_rows
from syncbench.bench.experiment.aggregate import scenario_cells

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


@pytest.mark.slow
def test_dpi_sets_the_png_size(two_strategies, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    sizes = {}
    for dpi in (50, 100):
        out = tmp_path / f"dpi{dpi}"
        rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--plot-format", "png",
                                "--dpi", str(dpi), capsys=capsys)
        assert rc == 0, err
        sizes[dpi] = _png_size(out / "headline.png")
    (w50, h50), (w100, h100) = sizes[50], sizes[100]
    assert abs(w100 - 2 * w50) <= 1 and abs(h100 - 2 * h50) <= 1
    assert abs(w100 - 720) <= 1  # two columns, 7.2 inches, at 100 dpi


@pytest.mark.slow
def test_the_default_format_is_vector_and_png_is_300_dpi(two_strategies, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc, _, err = report_cli(*two_strategies, "--plots", str(out), capsys=capsys)
    assert rc == 0, err
    assert {p.name for p in out.iterdir()} == {"headline.pdf", "convergence.pdf"}
    assert all(p.read_bytes().startswith(b"%PDF") for p in out.iterdir())
    png = tmp_path / "png"
    rc, _, err = report_cli(*two_strategies, "--plots", str(png), "--plot-format", "png",
                            capsys=capsys)
    assert rc == 0, err
    assert abs(_png_size(png / "headline.png")[0] - 7.2 * 300) <= 1


def _pdf_width_inches(path: Path) -> float:
    box = re.search(rb"/MediaBox \[\s*0 0 ([0-9.]+) ([0-9.]+)", path.read_bytes())
    assert box, path
    return float(box.group(1)) / 72


@pytest.mark.slow  # "one": the print-size test
@pytest.mark.parametrize("width, inches", [("two", 7.2)])
def test_figure_width_is_the_column_width(two_strategies, tmp_path, capsys, width, inches):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--figure-width", width,
                            "--per-run-plots", capsys=capsys)
    assert rc == 0, err
    for path in out.iterdir():
        assert _pdf_width_inches(path) == pytest.approx(inches, abs=0.01), path.name


@pytest.fixture
def saved_figures(monkeypatch):
    """Every matplotlib figure saved while the test runs (still written to its file)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def spy(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


@pytest.fixture
def flagged(tmp_path):
    """Two repeats of ssgd (the first LOADED: 60% of the cores taken by other processes)
    and of asgd, and one oscars run that never reaches the 0.8 target; N=2."""
    from test_analysis import make_evals

    paths = []
    for algorithm, walls in (("ssgd", (2.0, 2.2)), ("asgd", (1.0, 1.2))):
        for r, wall in enumerate(walls):
            paths.append(write_file(
                tmp_path / f"{algorithm}-r{r}.h5", algorithm=algorithm, world_size=2,
                wall=wall, steps_per_rank=STEPS, target=0.8,
                root={"foreign_cpu_share": 0.6} if algorithm == "ssgd" and r == 0 else None))
    paths.append(write_file(tmp_path / "oscars.h5", algorithm="oscars", world_size=2,
                            wall=1.5, steps_per_rank=STEPS, target=0.8,
                            evals=make_evals(accuracy=(0.5, 0.7))))
    return paths


def _texts(fig) -> list:
    import matplotlib.text

    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]


def test_every_figure_reads_at_print_size(flagged, tmp_path, capsys, saved_figures):
    out = tmp_path / "plots"
    rc, _, err = report_cli(*flagged[:1], *flagged[2:3], "--plots", str(out),
                            "--per-run-plots", "--figure-width", "one", capsys=capsys)
    assert rc == 0, err
    assert len(saved_figures) == 6  # headline, convergence, phases and timeline of two runs
    for path in out.iterdir():  # the default format, PDF, one column wide
        assert _pdf_width_inches(path) == pytest.approx(3.5, abs=0.01), path.name
    underscore = re.compile(r"\b[a-z]+_[a-z]+\b")
    for fig in saved_figures:
        small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < 8]
        assert small == []
        for ax in fig.axes:
            assert ax.get_xlabel()
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert not underscore.search(label), label
            assert not ax.get_ylabel() or "(" in ax.get_ylabel()  # a unit on a value axis
        title = fig.get_suptitle()
        assert not title.startswith("report") and not re.search(r"\([^)]*\(", title)


@pytest.mark.slow
def test_the_caption_names_the_experiment(flagged, tmp_path, capsys, saved_figures):
    out = tmp_path / "plots"
    rc, _, err = report_cli(*flagged, "--plots", str(out), capsys=capsys)
    assert rc == 0, err
    for fig in saved_figures:
        caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
        assert "Model mlp, dataset synthetic" in caption
        assert f"global batch {2 * BATCH} samples, 2 ranks" in caption
        assert "Machine: " in caption and "LOADED" in caption
    headline = " ".join(" ".join(t.get_text().split()) for t in saved_figures[0].texts)
    assert "median, min-max over up to 2 repeats" in headline


def test_the_caption_names_the_recorded_cpu(tmp_path):
    from syncbench.analysis.plot_style import experiment_caption, local_cpu_model
    from syncbench.bench.mpi.environment import cpu_fact

    fact = cpu_fact()  # what train records in the run file's environment facts
    assert fact.name == "CPU" and fact.value == (local_cpu_model() or "unknown")
    recorded = json.dumps({"CPU": {"value": "Test CPU 9000", "how": "/proc/cpuinfo"}})
    run = read_run(write_file(tmp_path / "a.h5", algorithm="ssgd", world_size=2, wall=1.0,
                              steps_per_rank=STEPS, root={"environment": recorded}))
    assert "Machine: Test CPU 9000, " in experiment_caption([run])
    other = read_run(write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=2, wall=1.0,
                                steps_per_rank=STEPS))  # on hosts node0, node1: not here
    assert "Machine: CPU model not recorded, " in experiment_caption([other])


def _whiskers(ax) -> int:
    from matplotlib.collections import LineCollection

    return sum(isinstance(c, LineCollection) for c in ax.collections)


def test_whiskers_only_where_a_bar_has_repeats(two_strategies, flagged):
    pytest.importorskip("matplotlib")
    from syncbench.analysis.plot_style import pyplot

    plt = pyplot()
    single, _ = headline_from_rows(table_rows([read_run(p) for p in two_strategies]))
    fig = headline_figure(plt, single)
    assert [_whiskers(ax) for ax in fig.axes] == [0, 0]
    plt.close(fig)
    head, _ = headline_from_rows(table_rows([read_run(p) for p in flagged]))
    assert head.bar("samples_per_s", "homogeneous", "oscars").n == 1
    fig = headline_figure(plt, head)
    # ssgd and asgd have two repeats each; oscars one (and no time to target)
    assert [_whiskers(ax) for ax in fig.axes] == [2, 2]
    plt.close(fig)


def test_flagged_and_unreached_bars_are_marked(flagged):
    pytest.importorskip("matplotlib")
    import matplotlib.patches as mpatches

    from syncbench.analysis.plot_style import pyplot

    plt = pyplot()
    head, _ = headline_from_rows(table_rows([read_run(p) for p in flagged]))
    assert head.bar("time_to_target", "homogeneous", "ssgd").flags == ("loaded",)
    assert head.bar("time_to_target", "homogeneous", "asgd").flags == ()
    fig = headline_figure(plt, head)
    for ax in fig.axes:
        hatches = {p.get_gid(): p.get_hatch() for p in ax.patches
                   if isinstance(p, mpatches.Rectangle) and p.get_gid()}
        assert hatches["bar homogeneous ssgd"]  # the LOADED baseline carries its mark
        assert not hatches["bar homogeneous asgd"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert FLAGS["loaded"][1] in legend
    reached = [t for t in fig.axes[0].texts if t.get_text() == "not\nreached"]
    assert len(reached) == 1 and reached[0].get_rotation() == 0
    assert reached[0].get_fontsize() >= 8
    plt.close(fig)


@pytest.mark.slow
def test_per_run_plots_only_when_asked(two_strategies, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc, _, err = report_cli(*two_strategies, "--plots", str(out), "--per-run-plots",
                            capsys=capsys)
    assert rc == 0, err
    names = {p.name for p in out.iterdir()}
    assert names == {"headline.pdf", "convergence.pdf", "ssgd_phases.pdf", "ssgd_timeline.pdf",
                     "asgd_phases.pdf", "asgd_timeline.pdf"}


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

    return [sorted(p.get_height() for p in ax.patches if isinstance(p, mpatches.Rectangle)
                   and not str(p.get_gid()).startswith("status"))  # a bar not drawn
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
    ylabels = [" ".join(ax.get_ylabel().split()) for ax in fig.axes]
    assert "time to target accuracy 0.8 / ssgd's" in ylabels[0] and "ratio" in ylabels[0]
    assert "samples/s / ssgd's" in ylabels[1]
    for ax in fig.axes:  # the baseline: a dashed line at 1.0 across the panel
        assert any(line.get_linestyle() == "--" and list(line.get_ydata()) == [1.0, 1.0]
                   for line in ax.lines)
    assert headline_note(head).startswith("Bars: median, min-max over 3 repeats")
    plt.close(fig)


def test_decentralized_runs_get_a_consensus_figure_at_their_evaluations(tmp_path, capsys):
    """The consensus distance each D-PSGD run recorded, at its evaluations' times; runs
    without one (SSGD) add nothing to it."""
    pytest.importorskip("matplotlib")
    from syncbench.analysis.plots import consensus_curve

    root = {"consensus_samples": [512, 1024], "consensus_distance": [4e-3, 1e-3],
            "spectral_gap": 0.5}
    gossip = write_file(tmp_path / "dpsgd.h5", algorithm="dpsgd", world_size=2, wall=1.0,
                        steps_per_rank=STEPS, root=root)
    plain = write_file(tmp_path / "ssgd.h5", algorithm="ssgd", world_size=2, wall=2.0,
                       steps_per_rank=STEPS)
    t, distance = consensus_curve(read_run(gossip))
    assert t.tolist() == [1.0, 2.0] and distance.tolist() == [4e-3, 1e-3]
    assert consensus_curve(read_run(plain)) is None
    out = tmp_path / "plots"
    rc, _, err = report_cli(gossip, plain, "--plots", str(out), "--plot-format", "png",
                            capsys=capsys)
    assert rc == 0, err
    assert (out / "consensus.png").read_bytes().startswith(PNG_MAGIC)
    rc, _, err = report_cli(plain, "--plots", str(tmp_path / "none"), capsys=capsys)
    assert rc == 0 and not list((tmp_path / "none").glob("consensus.*"))
