"""What data a run read: the run file's record of it (``schema.DATA_ATTRS``), ``data info``
and the report's "Data read" section.

A tiny MNIST-layout folder (IDX files, one of them gzipped) stands for a dataset, so
the two-rank run takes seconds.

Split off this module: ``tests/e2e/test_data_provenance_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import small_ssgd_run

from syncbench.analysis import schema
from syncbench.analysis.data_record import data_lines, data_record
from syncbench.bench.data import catalog
from syncbench.bench.data.provenance import arrays_sha256, data_attrs

#: The files of an MNIST-layout dataset, in the catalog's order, and their sample counts.
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")
SIZES = {"train": 64, "t10k": 16}


def _idx(array: np.ndarray) -> bytes:
    """An IDX file's bytes: magic (unsigned bytes, ndim), big-endian dimensions, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def make_mnist(folder: Path, seed: int = 0) -> list[Path]:
    """Write a small MNIST-layout dataset into ``folder``; its files in catalog order
    (the test labels gzipped: a file is hashed as stored)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for base in FILES:
        n = SIZES[base.split("-")[0]]
        array = (rng.integers(0, 256, size=(n, 28, 28)) if "images" in base
                 else rng.integers(0, 10, size=n))
        data = _idx(array)
        path = folder / base
        if base.startswith("t10k-labels"):
            path = folder / (base + ".gz")
            data = gzip.compress(data)
        path.write_bytes(data)
        paths.append(path)
    return paths


@pytest.fixture(autouse=True)
def _only_explicit_data(tmp_path, monkeypatch):
    """No $SYNCBENCH_DATA and an empty system folder: only the test's own data is found."""
    monkeypatch.delenv("SYNCBENCH_DATA", raising=False)
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", tmp_path / "no-system-data")


def test_a_file_dataset_is_recorded_by_folder_and_the_hash_of_the_files_read(tmp_path):
    paths = make_mnist(tmp_path / "real" / "mnist")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    ds = catalog.load_dataset("mnist", tmp_path / "link")
    assert ds.files == tuple(str(tmp_path / "link" / "mnist" / p.name) for p in paths)
    attrs = data_attrs(ds)
    assert attrs[schema.DATA_SOURCE_ATTR] == str((tmp_path / "real" / "mnist").resolve())
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
    assert attrs[schema.DATA_SHA256_ATTR] == whole
    files = json.loads(attrs[schema.DATA_FILES_ATTR])
    assert [f["name"] for f in files] == [p.name for p in paths]
    assert [f["bytes"] for f in files] == [p.stat().st_size for p in paths]
    assert [f["sha256"] for f in files] == [hashlib.sha256(p.read_bytes()).hexdigest()
                                            for p in paths]
    assert schema.DATA_GENERATOR_ATTR not in attrs
    # another copy with other contents: another hash
    make_mnist(tmp_path / "other", seed=1)
    other = data_attrs(catalog.load_dataset("mnist", tmp_path / "other"))
    assert other[schema.DATA_SHA256_ATTR] != whole


def test_generated_data_is_recorded_by_its_arguments_and_the_hash_of_its_arrays():
    ds = catalog.load_dataset("synthetic", synthetic_train=256, synthetic_test=64, seed=3)
    attrs = data_attrs(ds)
    assert attrs[schema.DATA_SOURCE_ATTR] == "generated"
    generator = json.loads(attrs[schema.DATA_GENERATOR_ATTR])
    assert generator == {"generator": "syncbench-synthetic/1", "train": 256, "test": 64,
                         "shape": [1, 28, 28], "classes": 10, "seed": 3}
    digest = hashlib.sha256()
    for array in (ds.train_x, ds.train_y, ds.test_x, ds.test_y):
        digest.update(array.tobytes())
    assert attrs[schema.DATA_SHA256_ATTR] == digest.hexdigest() == arrays_sha256(ds)
    again = catalog.load_dataset("synthetic", synthetic_train=256, synthetic_test=64, seed=3)
    assert data_attrs(again) == attrs
    other = catalog.load_dataset("synthetic", synthetic_train=256, synthetic_test=64, seed=4)
    assert data_attrs(other)[schema.DATA_SHA256_ATTR] != attrs[schema.DATA_SHA256_ATTR]


def test_a_file_without_the_record_reads_as_not_recorded():
    """Older run files (and simulations) have no data attributes: readers default them."""
    record = data_record({"dataset": "fashion-mnist"})
    assert record == {"dataset": "fashion-mnist", "source": None, "sha256": None,
                      "files": [], "generator": {}}
    assert data_lines([{"dataset": "fashion-mnist"}] * 2) == [
        "fashion-mnist: not recorded (run file written before data provenance) (2 runs)"]


def test_data_info_takes_data_dir_before_or_after_the_action(tmp_path, capsys):
    """``data --data-dir X info NAME`` is ``data info NAME --data-dir X``; a --data-dir
    before ``fetch`` (which writes into --out-dir) is one line and exit 2."""
    from syncbench.bench.cli import main

    paths = make_mnist(tmp_path / "mnist")
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
    assert main(["data", "--data-dir", str(tmp_path), "info", "mnist"]) == 0
    before = capsys.readouterr().out
    assert main(["data", "info", "mnist", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == before and f"sha256 {whole}" in before
    assert main(["data", "--data-dir", str(tmp_path), "fetch", "mnist"]) == 2
    captured = capsys.readouterr()
    assert not captured.out and captured.err.count("\n") == 1
    assert "--data-dir" in captured.err and "--out-dir" in captured.err


def _run_file(path: Path, data: dict) -> None:
    """A complete 2-rank SSGD run file, as train writes it, with the data record ``data``
    (root attributes; empty: none)."""
    small_ssgd_run(path, dataset="mnist", **data)


def test_report_json_and_csv_carry_the_whole_data_record(tmp_path, capsys):
    """``report --format json|csv``: each run's data_source, data_sha256, data_files (name,
    bytes, sha256 of each file read) and data_generator, as the run file records them
    (the Markdown tells the same under "Data read"); a group of repeats over the same data
    keeps them, a run without a record has none."""
    from syncbench.bench.cli import main

    make_mnist(tmp_path / "data" / "mnist")
    files = data_attrs(catalog.load_dataset("mnist", tmp_path / "data"))
    generated = data_attrs(catalog.load_dataset("synthetic", synthetic_train=256,
                                                synthetic_test=64, seed=3))
    paths = [tmp_path / n for n in ("files.h5", "generated.h5", "older.h5")]
    for path, attrs in zip(paths, (files, generated, {}), strict=True):
        _run_file(path, attrs)  # the last: a file written before the data's record
    runs = [str(p) for p in paths]
    assert main(["report", *runs, "--format", "json"]) == 0
    rows = {r["path"]: r for r in json.loads(capsys.readouterr().out)}
    assert [rows[runs[0]][k] for k in ("data_source", "data_sha256", "data_files",
                                       "data_generator")] == [
        files[schema.DATA_SOURCE_ATTR], files[schema.DATA_SHA256_ATTR],
        json.loads(files[schema.DATA_FILES_ATTR]), None]
    assert rows[runs[1]]["data_generator"] == json.loads(generated[schema.DATA_GENERATOR_ATTR])
    assert rows[runs[1]]["data_files"] is None
    assert [rows[runs[2]][k] for k in ("data_sha256", "data_files", "data_generator")] == [
        None, None, None]
    assert main(["report", *runs, "--format", "csv"]) == 0
    table = {r["path"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert json.loads(table[runs[0]]["data_files"]) == json.loads(files[schema.DATA_FILES_ATTR])
    assert json.loads(table[runs[1]]["data_generator"]) == json.loads(
        generated[schema.DATA_GENERATOR_ATTR])
    assert table[runs[0]]["data_sha256"] == files[schema.DATA_SHA256_ATTR]
    assert table[runs[2]]["data_files"] == table[runs[2]]["data_generator"] == ""
    # repeats of the same data, grouped: the group keeps the record
    _run_file(tmp_path / "again.h5", files)
    assert main(["report", runs[0], str(tmp_path / "again.h5"), "--format", "json",
                 "--by", "algorithm"]) == 0
    (group,) = json.loads(capsys.readouterr().out)
    assert group["data_files"] == json.loads(files[schema.DATA_FILES_ATTR])
