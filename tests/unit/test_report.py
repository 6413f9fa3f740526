"""Run files built by hand with h5py: summarize, read_run, report_rows, format_report.

Split off this module: ``tests/e2e/test_report_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import csv
import io
import json
import math

import h5py
import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.analysis.report import FORMATS, format_report, report_rows
from syncbench.analysis.runfile import Run, RunFileError, read_run
from syncbench.analysis.summary import summarize

NAN = float("nan")
WALL_S = 4.0
TARGET = 0.8


def rank_rows(rank: int, n_steps: int = 3) -> dict[str, np.ndarray]:
    """Distinct, hand-checkable numbers for every column of one rank."""
    cols: dict[str, np.ndarray] = {}
    for j, (name, dtype) in enumerate(schema.RANK_COLUMNS.items()):
        cols[name] = (np.arange(n_steps) + 10 * j + 100 * rank).astype(dtype)
    cols["step"] = np.arange(n_steps, dtype=schema.RANK_COLUMNS["step"])
    cols["samples"] = np.full(n_steps, 32 + rank, dtype=schema.RANK_COLUMNS["samples"])
    cols["t_comm"] = np.full(n_steps, 0.1 * (rank + 1), dtype=schema.RANK_COLUMNS["t_comm"])
    cols["t_wait"] = np.full(n_steps, 0.05, dtype=schema.RANK_COLUMNS["t_wait"])
    return cols


def eval_rows(accuracy=(0.5, 0.85, 0.9)) -> dict[str, np.ndarray]:
    n = len(accuracy)
    return {
        "t": np.array([1.0, 2.0, 3.5][:n], dtype=schema.EVAL_COLUMNS["t"]),
        "step": np.arange(n, dtype=schema.EVAL_COLUMNS["step"]) * 10,
        "samples_seen": np.arange(n, dtype=schema.EVAL_COLUMNS["samples_seen"]) * 640,
        "loss": np.array([2.0, 1.0, 0.5][:n], dtype=schema.EVAL_COLUMNS["loss"]),
        "accuracy": np.array(accuracy, dtype=schema.EVAL_COLUMNS["accuracy"]),
    }


def root_attrs(world_size: int, algorithm: str = "ssgd") -> dict:
    attrs = {name: f"value-of-{name}" for name in schema.ROOT_ATTRS}
    attrs.update(
        schema=schema.SCHEMA,
        algorithm=algorithm,
        world_size=world_size,
        config=json.dumps({"algorithm": algorithm, "lr": 0.1, "np": world_size}),
        cuda_aware=False,
        hostnames=np.array([b"node0", b"node1"][:world_size]),
    )
    return attrs


def write_run(
    path,
    *,
    world_size: int = 2,
    algorithm: str = "ssgd",
    evals: dict | None = None,
    summary: dict | None = None,
    attrs: dict | None = None,
    complete: bool | None = None,
    skip: tuple[str, ...] = (),
):
    """Write a complete ``syncbench/1`` file from the schema's names.

    ``skip`` lists paths (``ranks/00001/t_comm``, ``eval``, ``summary``) to leave out.
    """
    ranks = {r: rank_rows(r) for r in range(world_size)}
    evals = eval_rows() if evals is None else evals
    if summary is None:
        summary = summarize(ranks, evals, WALL_S, TARGET)
    with h5py.File(path, "w") as f:
        for key, value in {**root_attrs(world_size, algorithm), **(attrs or {})}.items():
            f.attrs[key] = value
        if complete is not None:
            f.attrs[schema.COMPLETE_ATTR] = complete
        for rank, cols in ranks.items():
            group = schema.rank_group(rank)
            if group in skip:
                continue
            g = f.create_group(group)
            g.attrs["hostname"] = f"node{rank}"
            g.attrs["device"] = "cpu"
            g.attrs["slowdown"] = 1.0 + rank
            for name, data in cols.items():
                if f"{group}/{name}" not in skip:
                    g.create_dataset(name, data=data)
        if schema.EVAL_GROUP not in skip:
            g = f.create_group(schema.EVAL_GROUP)
            for name, data in evals.items():
                g.create_dataset(name, data=data)
        if schema.SUMMARY_GROUP not in skip:
            g = f.create_group(schema.SUMMARY_GROUP)
            for key, value in summary.items():
                g.attrs[key] = value
    return ranks, evals, summary


# ---------------------------------------------------------------- summarize


def test_summarize_hand_computed():
    ranks = {0: rank_rows(0), 1: rank_rows(1)}
    s = summarize(ranks, eval_rows(), WALL_S, TARGET)
    assert tuple(s) == schema.SUMMARY_ATTRS
    assert s["wall_s"] == WALL_S
    assert s["samples_per_s"] == pytest.approx((3 * 32 + 3 * 33) / 4.0)
    assert s["final_accuracy"] == 0.9
    assert s["final_loss"] == 0.5
    assert s["time_to_target_s"] == 2.0  # first row with accuracy >= 0.8
    assert s["comm_fraction"] == pytest.approx((3 * 0.1 + 3 * 0.2) / (2 * 4.0))
    assert s["wait_fraction"] == pytest.approx((6 * 0.05) / (2 * 4.0))
    assert all(isinstance(v, float) for v in s.values())


def test_summarize_target_exactly_met_and_nan_accuracy():
    s = summarize({0: rank_rows(0)}, eval_rows((NAN, 0.8, 0.7)), WALL_S, 0.8)
    assert s["time_to_target_s"] == 2.0
    assert s["final_accuracy"] == 0.7


def test_summarize_nan_cases():
    ranks = {0: rank_rows(0)}
    s = summarize(ranks, eval_rows(), WALL_S, None)
    assert math.isnan(s["time_to_target_s"])
    s = summarize(ranks, eval_rows(), WALL_S, 0.95)  # never reached
    assert math.isnan(s["time_to_target_s"])
    s = summarize(ranks, eval_rows(()), WALL_S, TARGET)  # no eval rows
    assert math.isnan(s["final_accuracy"]) and math.isnan(s["final_loss"])
    assert math.isnan(s["time_to_target_s"])
    assert s["samples_per_s"] == pytest.approx(96 / 4.0)
    for wall in (0.0, -1.0):
        s = summarize(ranks, eval_rows(), wall, TARGET)
        assert s["wall_s"] == wall
        assert math.isnan(s["samples_per_s"])
        assert math.isnan(s["comm_fraction"]) and math.isnan(s["wait_fraction"])
        assert s["final_accuracy"] == 0.9
    s = summarize({}, {}, WALL_S, TARGET)
    assert math.isnan(s["comm_fraction"]) and math.isnan(s["final_accuracy"])


# ---------------------------------------------------------------- read_run


def test_read_run_round_trip(tmp_path):
    path = tmp_path / "run.h5"
    ranks, evals, summary = write_run(path, world_size=2, algorithm="asgd")
    run = read_run(path)
    assert isinstance(run, Run)
    assert run.path == str(path)
    assert run.complete is True
    assert run.world_size == 2 and run.algorithm == "asgd"
    assert sorted(run.ranks) == [0, 1]
    for rank, cols in ranks.items():
        assert set(run.ranks[rank]) == set(schema.RANK_COLUMNS)
        for name, data in cols.items():
            np.testing.assert_array_equal(run.ranks[rank][name], data)
            assert run.ranks[rank][name].dtype == np.dtype(schema.RANK_COLUMNS[name])
        assert run.rank_attrs[rank] == {
            "hostname": f"node{rank}",
            "device": "cpu",
            "slowdown": 1.0 + rank,
        }
    assert set(run.eval) == set(schema.EVAL_COLUMNS)
    for name, data in evals.items():
        np.testing.assert_array_equal(run.eval[name], data)
    assert run.summary == summary
    assert set(schema.ROOT_ATTRS) <= set(run.attrs)
    assert run.attrs["schema"] == schema.SCHEMA
    assert run.attrs["config"] == {"algorithm": "asgd", "lr": 0.1, "np": 2}
    assert run.config == run.attrs["config"]
    assert run.attrs["hostnames"] == ["node0", "node1"]
    assert run.attrs["cuda_aware"] is False
    assert run.attrs["model"] == "value-of-model"
    assert run.steps == {0: 3, 1: 3}


def test_bytes_attributes_are_decoded(tmp_path):
    path = tmp_path / "run.h5"
    write_run(path, attrs={"algorithm": np.bytes_(b"oscars"), "schema": np.bytes_(b"syncbench/1")})
    run = read_run(path)
    assert run.algorithm == "oscars" and isinstance(run.algorithm, str)


def test_incomplete_run_reads_back_false(tmp_path):
    path = tmp_path / "partial.h5"
    # A run rebuilt from checkpoints may lack a crashed rank's group.
    write_run(path, world_size=2, complete=False, skip=("ranks/00001",))
    run = read_run(path)
    assert run.complete is False
    assert sorted(run.ranks) == [0]
    assert run.world_size == 2
    write_run(path, complete=True)
    assert read_run(path).complete is True


def _one_line_error(path) -> str:
    with pytest.raises(RunFileError) as info:
        read_run(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


@pytest.mark.parametrize(("where", "value", "named"), [
    ("ranks/00001/t_comm", -5.0, "/ranks/00001/t_comm"),
    ("ranks/00000/t_wait", NAN, "/ranks/00000/t_wait"),
    ("ranks/00001/t_start", 1e170, "/ranks/00001/t_start"),
    ("ranks/00000/samples", -3, "/ranks/00000/samples"),
    ("eval/accuracy", 7.0, "/eval/accuracy"),
])
def test_values_outside_physical_bounds_are_a_corrupt_file(tmp_path, where, value, named):
    path = tmp_path / "bad.h5"
    write_run(path)
    with h5py.File(path, "r+") as f:
        f[where][1] = value
    message = _one_line_error(path)
    assert f"is corrupt: {named} " in message and "at row 1" in message


def test_a_diverged_loss_is_no_corruption(tmp_path):
    path = tmp_path / "diverged.h5"
    write_run(path)
    with h5py.File(path, "r+") as f:
        f["ranks/00000/loss"][1] = NAN
        f["ranks/00001/loss"][2] = math.inf
    assert math.isnan(read_run(path).ranks[0]["loss"][1])


def test_wrong_schema(tmp_path):
    path = tmp_path / "old.h5"
    write_run(path, attrs={"schema": "syncbench/0"})
    message = _one_line_error(path)
    assert f"has schema 'syncbench/0', expected '{schema.SCHEMA}'" in message


def test_missing_schema_attribute(tmp_path):
    path = tmp_path / "noschema.h5"
    with h5py.File(path, "w") as f:
        f.attrs["algorithm"] = "ssgd"
    assert "schema" in _one_line_error(path)


@pytest.mark.parametrize(
    "skip, missing",
    [
        ("ranks/00001/t_comm", "/ranks/00001/t_comm"),
        ("ranks/00001", "/ranks/00001"),
        ("eval", "/eval"),
        ("summary", "/summary"),
    ],
)
def test_missing_dataset_or_group(tmp_path, skip, missing):
    path = tmp_path / "broken.h5"
    write_run(path, skip=(skip,))
    message = _one_line_error(path)
    assert message.endswith(f"is incomplete: missing {missing}")


def test_missing_summary_attribute(tmp_path):
    path = tmp_path / "nosum.h5"
    ranks = {0: rank_rows(0), 1: rank_rows(1)}
    summary = summarize(ranks, eval_rows(), WALL_S, TARGET)
    del summary["comm_fraction"]
    write_run(path, summary=summary)
    assert "comm_fraction" in _one_line_error(path)


def test_not_hdf5_missing_and_truncated(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("this is not HDF5\nsecond line\n")
    assert "is not an HDF5 file" in _one_line_error(text)
    assert "does not exist" in _one_line_error(tmp_path / "nope.h5")
    good = tmp_path / "good.h5"
    write_run(good)
    data = good.read_bytes()
    for name in ("run.h5.tmp", "run.h5.tmp.1234"):
        partial = tmp_path / name
        partial.write_bytes(data[: len(data) // 2])
        message = _one_line_error(partial)
        assert "temporary" in message
    empty = tmp_path / "empty.h5.tmp"
    empty.write_bytes(b"")
    _one_line_error(empty)


# ---------------------------------------------------------------- report


@pytest.fixture
def two_runs(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    write_run(a, world_size=2, algorithm="ssgd")
    write_run(b, world_size=1, algorithm="asgd", evals=eval_rows((0.1, 0.2)))  # target missed
    return [str(a), str(b)]


def test_report_rows(two_runs):
    rows = report_rows(two_runs)
    assert len(rows) == 2
    for row, path in zip(rows, two_runs, strict=True):
        assert list(row) == [*schema.REPORT_KEYS, "path"]
        assert row["path"] == path
        run = read_run(path)
        for key in schema.REPORT_KEYS:
            if key in run.summary:
                assert row[key] == run.summary[key] or (
                    math.isnan(row[key]) and math.isnan(run.summary[key])
                )
    assert rows[0]["algorithm"] == "ssgd" and rows[0]["world_size"] == 2
    assert rows[0]["samples_per_s"] == pytest.approx((96 + 99) / WALL_S)
    assert rows[0]["time_to_target_s"] == 2.0
    assert rows[1]["world_size"] == 1
    assert math.isnan(rows[1]["time_to_target_s"])


def test_report_rows_propagates_errors(tmp_path, two_runs):
    bad = tmp_path / "bad.h5"
    bad.write_text("nope")
    with pytest.raises(RunFileError, match="bad.h5"):
        report_rows([*two_runs, str(bad)])


def test_format_json(two_runs):
    text = format_report(report_rows(two_runs), "json")
    assert "NaN" not in text
    data = json.loads(text)
    assert isinstance(data, list) and len(data) == 2
    for obj, path in zip(data, two_runs, strict=True):
        assert list(obj) == [*schema.REPORT_KEYS, "path"]
        assert obj["path"] == path
    assert data[0]["time_to_target_s"] == 2.0
    assert data[1]["time_to_target_s"] is None
    assert data[1]["world_size"] == 1 and data[1]["algorithm"] == "asgd"
    assert json.loads(format_report([], "json")) == []


def test_format_csv(two_runs):
    text = format_report(report_rows(two_runs), "csv")
    records = list(csv.DictReader(io.StringIO(text)))
    assert len(records) == 2
    assert list(records[0]) == list(schema.REPORT_KEYS)
    assert records[0]["algorithm"] == "ssgd" and records[0]["world_size"] == "2"
    assert float(records[0]["samples_per_s"]) == pytest.approx(195 / WALL_S)
    assert float(records[0]["time_to_target_s"]) == 2.0
    assert records[1]["time_to_target_s"] == ""


def test_format_md(two_runs):
    rows = report_rows(two_runs)
    text = format_report(rows, "md")
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two rows
    assert len({len(line) for line in lines}) == 1  # fixed width
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(schema.REPORT_KEYS)
    assert set(lines[1]) <= set("|-: ")
    first = dict(zip(header, (c.strip() for c in lines[2].strip("|").split("|")), strict=True))
    second = dict(zip(header, (c.strip() for c in lines[3].strip("|").split("|")), strict=True))
    assert first["algorithm"] == "ssgd" and first["world_size"] == "2"
    assert first["samples_per_s"] == f"{195 / WALL_S:.1f}"
    assert first["final_accuracy"] == "0.9000"
    assert rows[0]["comm_fraction"] == pytest.approx((0.3 + 0.6) / (2 * WALL_S))
    assert first["comm_fraction"] == f"{rows[0]['comm_fraction']:.3f}"
    assert first["wait_fraction"] == f"{rows[0]['wait_fraction']:.3f}" == "0.038"
    assert first["wall_s"] == "4.00" and first["time_to_target_s"] == "2.00"
    assert second["time_to_target_s"] == "-"
    assert second["final_accuracy"] == "0.2000"
    assert "nan" not in text.lower()


def test_format_unknown(two_runs):
    with pytest.raises(ValueError) as info:
        format_report(report_rows(two_runs), "xml")
    for name in FORMATS:
        assert name in str(info.value)
    assert set(FORMATS) == {"md", "csv", "json"}


def test_recorder_charges_late_work_to_the_last_step():
    from syncbench.algorithms.base import StepStats
    from syncbench.bench.train.recorder import StepRecorder

    rec = StepRecorder(4)
    rec.add_to_last({"wait": 1.0})  # no row yet: nothing to charge
    phases = dict.fromkeys(schema.PHASES, 0.1)
    rec.append(0, 0.0, phases, StepStats(loss=1.0, samples=8))
    rec.append(1, 0.6, phases, StepStats(loss=1.0, samples=8))
    rec.add_to_last({"wait": 0.25, "update": 0.05})  # e.g. a reduction completed before an eval
    cols = rec.columns()
    assert cols["t_wait"].tolist() == [0.1, pytest.approx(0.35)]
    assert cols["t_update"].tolist() == [0.1, pytest.approx(0.15)]
    assert cols["t_compute"].tolist() == [0.1, 0.1]
