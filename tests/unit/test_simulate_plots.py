"""``python -m syncbench.bench.simulate.plots``: its bad input and unwritable output give one
line and exit 2, before any figure is drawn (no matplotlib needed for these)."""

from __future__ import annotations

import h5py
import pytest

from syncbench.analysis import schema
from syncbench.bench.simulate.plots import main, read_points


def _simulated(path, n: int, rate: float, algorithm: str = "ssgd") -> str:
    with h5py.File(path, "w") as f:
        f.attrs[schema.SIMULATED_ATTR] = True
        f.attrs[schema.SCALING_MODE_ATTR] = "weak"
        f.attrs["algorithm"] = algorithm
        f.attrs["world_size"] = n
        f.create_group(schema.SUMMARY_GROUP).attrs["samples_per_s"] = rate
    return str(path)


def test_read_points_groups_simulated_runs_by_mode_and_strategy(tmp_path):
    paths = [_simulated(tmp_path / "a.h5", 64, 2e6), _simulated(tmp_path / "b.h5", 8, 3e5)]
    assert read_points(paths) == {("weak", "ssgd"): [(8, 3e5), (64, 2e6)]}


@pytest.mark.parametrize("make,line", [
    (lambda d: str(d / "missing.h5"), "{d}/missing.h5: not a readable HDF5 run file"),
    (lambda d: (d / "text.h5").write_text("not hdf5") and str(d / "text.h5"),
     "{d}/text.h5: not a readable HDF5 run file"),
])
def test_an_unreadable_input_is_one_line(tmp_path, capsys, make, line):
    path = make(tmp_path)
    assert main([path, "-o", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "plots: error: " + line.format(d=tmp_path)]


def test_an_unwritable_output_is_one_line_and_nothing_is_drawn(tmp_path, capsys):
    run = _simulated(tmp_path / "a.h5", 8, 3e5)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([run, "-o", str(blocker / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"plots: error: -o {blocker}/x.png: ")
    assert not (blocker.parent / "x.png").exists()
