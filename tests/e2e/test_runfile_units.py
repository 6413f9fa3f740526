"""Run files that explain themselves, a tidy per-step table, results files that move.

A real 2-rank ``syncbench train`` under ``mpiexec``: every dataset carries its
``units`` and ``description`` from ``schema.DATASET_INFO`` and no attribute is
``""``; ``syncbench report --format steps`` round-trips to ``read_run``'s rows;
``to_frame`` needs pandas (skipped without it, one clear error). A runner's
results folder moved elsewhere resumes there and its paths resolve.

Split off this module: ``tests/unit/test_runfile_units_unit.py`` (its tests that need
neither).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.analysis.steps import EVAL_KEYS, STEP_KEYS
from syncbench.bench.experiment.results_paths import (
    read_results,
    resolved_paths,
)

TRAIN = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--batch-size", "32",
         "--epochs", "0.2", "--eval-every", "0.1", "--eval-model", "both"]


def syncbench(*args: str, timeout: float = 120, cwd: str | None = None
              ) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "syncbench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("units") / "run.h5"
    proc = run_mpi(2, "train", *TRAIN, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _info_key(dataset: h5py.Dataset) -> str:
    """The DATASET_INFO key of a dataset's group: an events group's (``/ranks/events``,
    ``/ranks/<r>/events``), the ranks' (``/ranks``, ``/ranks/<r>``), or the group's name."""
    parent = dataset.parent.name.strip("/").split("/")
    if parent[-1] == schema.EVENTS_GROUP:
        return schema.EVENTS_GROUP
    if parent[0] == schema.RANKS_GROUP:
        return schema.RANKS_GROUP
    return parent[-1]


def _empty_strings(value) -> bool:
    if isinstance(value, bytes | str):
        return len(value) == 0
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return any(_empty_strings(v) for v in value.ravel().tolist())
    return False


def test_every_dataset_has_units_and_description_and_no_attribute_is_empty(run_file):
    datasets, empty = [], []

    def visit(name, obj):
        for key, value in obj.attrs.items():
            if _empty_strings(value):
                empty.append(f"{name}@{key}")
        if isinstance(obj, h5py.Dataset):
            datasets.append(obj.name)
            units, description = schema.DATASET_INFO[_info_key(obj)][name.rsplit("/", 1)[1]]
            assert obj.attrs[schema.UNITS_ATTR] == units, name
            assert obj.attrs[schema.DESCRIPTION_ATTR] == description, name
            if obj.dtype.kind in "OS" and _empty_strings(obj[()]):  # a rank's unknown value
                empty.append(name)

    with h5py.File(run_file, "r") as f:
        assert f.attrs[schema.RANK_LAYOUT_ATTR] == schema.RANK_LAYOUT_PACKED
        visit("/", f)
        f.visititems(visit)
        assert f["ranks/rank"][()].tolist() == [0, 1]
    assert not empty, empty
    # the packed ranks: every rank column, the index, every rank attribute, and every
    # column of /eval and /eval_local
    assert {"/ranks/t_comm", "/ranks/rows", "/ranks/hostname", "/ranks/clock_offset_s",
            "/eval/accuracy", "/eval_local/accuracy"} <= set(datasets)
    assert len(datasets) >= len(schema.RANK_COLUMNS) + 2 + 2 * len(schema.EVAL_COLUMNS)
    run = read_run(run_file)
    assert set(schema.ROOT_ATTRS) - set(run.attrs) <= set(schema.OPTIONAL_ROOT_ATTRS)
    assert run.eval_local is not None and len(run.eval_local["t"]) == len(run.eval["t"])


def _csv_rows(text: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames) == STEP_KEYS
    return list(reader)


def test_steps_csv_round_trips_to_the_run_files_rows(run_file, tmp_path):
    run = read_run(run_file)
    proc = syncbench("report", str(run_file), "--format", "steps")
    assert proc.returncode == 0, proc.stderr
    rows = _csv_rows(proc.stdout)
    assert len(rows) == sum(run.steps.values())
    for rank, cols in run.ranks.items():
        mine = [r for r in rows if r["rank"] == str(rank)]
        assert [int(r["step"]) for r in mine] == cols["step"].tolist()
        assert [float(r["t_comm"]) for r in mine] == cols["t_comm"].tolist()  # exact
        assert [float(r["loss"]) for r in mine] == cols["loss"].tolist()
        assert {r["hostname"] for r in mine} == {run.rank_attrs[rank]["hostname"]}
        assert {r["node"] for r in mine} == {str(run.rank_attrs[rank]["node"])}
    assert {(r["run"], r["path"], r["algorithm"], r["world_size"]) for r in rows} == {
        ("run", str(run_file), "ssgd", "2")}
    # -o FILE.csv holds the same table; --format eval a row per evaluation of both groups
    out = tmp_path / "steps.csv"
    assert syncbench("report", str(run_file), "--format", "steps", "-o", str(out)
                     ).returncode == 0
    assert out.read_text() == proc.stdout
    proc = syncbench("report", str(run_file), "--format", "eval")
    evals = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert tuple(evals[0]) == EVAL_KEYS
    assert [float(r["accuracy"]) for r in evals if r["group"] == "eval"] == \
        run.eval["accuracy"].tolist()
    assert [float(r["t"]) for r in evals if r["group"] == "eval_local"] == \
        run.eval_local["t"].tolist()


def test_parquet_needs_pyarrow_and_o_writes_other_formats(run_file, tmp_path):
    out = tmp_path / "steps.parquet"
    proc = syncbench("report", str(run_file), "--format", "steps", "-o", str(out))
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert proc.returncode == 2 and not out.exists()
        assert len(proc.stderr.strip().splitlines()) == 1 and "pyarrow" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        table = pq.read_table(out)
        assert tuple(table.column_names) == STEP_KEYS
        assert table.num_rows == sum(read_run(run_file).steps.values())
    proc = syncbench("report", str(run_file), "--format", "md", "-o", str(tmp_path / "x"))
    assert proc.returncode == 0 and proc.stdout == ""  # -o writes any format
    assert (tmp_path / "x").read_text().startswith("## Runs")


def test_to_frame_is_the_steps_table(run_file):
    pd = pytest.importorskip("pandas")
    run = read_run(run_file)
    frame = run.to_frame()
    assert isinstance(frame, pd.DataFrame) and tuple(frame.columns) == STEP_KEYS
    assert len(frame) == sum(run.steps.values())
    for rank, cols in run.ranks.items():
        np.testing.assert_array_equal(frame[frame["rank"] == rank]["t_comm"], cols["t_comm"])
    evals = run.to_frame("eval")
    assert tuple(evals.columns) == EVAL_KEYS
    assert sorted(set(evals["group"])) == ["eval", "eval_local"]
    with pytest.raises(ValueError, match="unknown table"):
        run.to_frame("nope")


def test_to_frame_without_pandas_is_one_clear_error(run_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ImportError, match="pip install pandas"):
        read_run(run_file).to_frame()


# ---------------------------------------------------------------- results paths


SCENARIO = """
description = "one small run"
np = 1
repeats = 1
target_accuracy = 0.3
eval_every = 0.1
flags = { dataset = "synthetic", synthetic_samples = 1024, epochs = 0.2, batch_size = 32 }

[[run]]
label = "ssgd"
algorithm = "ssgd"
"""


def test_a_moved_results_folder_resumes_and_its_paths_resolve(tmp_path):
    scenario = tmp_path / "one.toml"
    scenario.write_text(SCENARIO)
    proc = syncbench("run", str(scenario), "--out-dir", "first", "--order-seed", "1",
                     timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    stored = json.loads((tmp_path / "first" / "results.json").read_text())
    assert [r["path"] for r in stored["runs"]] == ["ssgd-hom-r0.h5"]
    assert stored["plan"][0]["path"] == "ssgd-hom-r0.h5"
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(tmp_path / "first", moved)
    results = read_results(moved / "results.json")
    assert all(Path(r["path"]).is_file() for r in results["runs"])
    assert read_run(results["runs"][0]["path"]).complete
    again = syncbench("run", str(scenario), "--out-dir", str(moved), "--resume", timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("kept by --resume") == 1
    # a results file written before paths were relative (absolute paths) still resumes
    absolute = resolved_paths(json.loads((moved / "results.json").read_text()),
                              moved.resolve())
    assert Path(absolute["plan"][0]["path"]).is_absolute()
    (moved / "results.json").write_text(json.dumps(absolute))
    again = syncbench("run", str(scenario), "--out-dir", str(moved.resolve()), "--resume",
                      timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("kept by --resume") == 1
