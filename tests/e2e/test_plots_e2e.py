"""The figures of ``--plots``: formats, resolution, per-run plots on request, the headline,: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_plots.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from syncbench.analysis.headline import (
    headline_from_results,
)

GOLDEN = Path("/work/golden")


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
