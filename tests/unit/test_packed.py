"""The packed rank layout: one ``Run`` from both layouts, per-rank reductions, the trace's sample.

Hand-built files (``write_run_file`` with ``layout=``): the same rows, attributes,
events and evaluations written packed and as the groups layout of older files read
back into equal ``Run`` objects (every column with its dtype, every attribute),
equal event tables and equal report and trace outputs; the packed reader's
errors are one line naming what is wrong; ``PackedRows``' reductions equal NumPy's
per rank; ``syncbench trace`` samples a run of more ranks than ``--max-ranks`` and
says so. Serial.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import h5py
import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.analysis.collectives import read_events
from syncbench.analysis.packed import PackedRows
from syncbench.analysis.runfile import Run, RunFileError, read_run
from syncbench.analysis.trace import (
    DEFAULT_MAX_RANKS,
    sample_ranks,
    trace_events,
)
from syncbench.bench.commands import report as report_command
from syncbench.bench.commands import trace as trace_command
from syncbench.bench.train.recorder import write_run_file

NAN = float("nan")
#: Rows per rank: unequal (an ASGD-like run), and a rank without rows (a serving rank).
COUNTS = {0: 4, 1: 7, 2: 0, 3: 5}


def _rank_rows(rank: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rank)
    cols = {}
    for name, dtype in schema.RANK_COLUMNS.items():
        cols[name] = (rng.random(n) if dtype == "f8" else rng.integers(0, 50, n)).astype(dtype)
    cols["step"] = np.arange(n, dtype=np.int64)
    cols["t_start"] = np.arange(n) * 0.5
    if rank == 1 and n:
        cols["loss"][2] = NAN
    return cols


def _rank_attrs() -> dict[int, dict]:
    clocks = {name: 1e-6 * (i + 1) for i, name in enumerate(schema.CLOCK_ATTRS)}
    return {
        0: {"hostname": "node-a", "node": 0, "device": "cpu", "slowdown": 1.0,
            "slowdown_mode": "none", "slowdown_reference_s": NAN, "slowdown_realised": 1.0,
            "node_speed": 1.0, **clocks},
        1: {"hostname": "node-b", "node": 1, "device": "cpu", "slowdown": 3.0,
            "slowdown_mode": "sleep", "slowdown_reference_s": 0.01, "slowdown_realised": 2.5,
            "node_speed": 0.5, **clocks},
        2: {"hostname": "node-b", "node": 1},  # everything else unknown
        3: {"hostname": "nöde-ü", "device": "", "slowdown": None, **clocks},
    }


def _events() -> dict[int, tuple[dict[str, np.ndarray], dict[str, int]]]:
    out = {}
    for rank, n in ((0, 3), (1, 5), (3, 0)):
        cols = {name: np.arange(n).astype(dtype) for name, dtype in schema.EVENT_COLUMNS.items()}
        cols["t_post"] = np.arange(n) * 0.1 + rank
        cols["t_done"] = cols["t_post"] + 0.05
        out[rank] = (cols, {"capacity": 64, "stride": 1 + rank, "recorded": n + rank,
                            "dropped": rank})
    return out


def _evals(n: int) -> dict[str, np.ndarray]:
    return {"t": np.arange(n) * 1.0, "step": np.arange(n) * 2 + 1,
            "samples_seen": np.arange(n) * 64, "loss": np.linspace(2, 1, n),
            "accuracy": np.linspace(0.2, 0.9, n)}


ROOT = {"algorithm": "asgd", "model": "mlp", "dataset": "synthetic", "world_size": 4,
        "config": json.dumps({"algorithm": "asgd", "batch_size": 32}),
        "hostnames": ["node-a", "node-b", "nöde-ü"], "ranks_per_node": [1, 2, 1]}


def _write(path, layout: str, counts=None, complete: bool = True, **kw) -> str:
    counts = COUNTS if counts is None else counts
    rows = {r: _rank_rows(r, n) for r, n in counts.items()}
    attrs = {r: a for r, a in _rank_attrs().items() if r in counts}
    write_run_file(path, {**ROOT, "world_size": kw.pop("world_size", 4)}, rows, attrs,
                   _evals(3), 6.0, 0.5, complete=complete, num_classes=10,
                   local_evals=_evals(2), stopped_by="" if complete else "SIGTERM",
                   layout=layout, **kw)
    return str(path)


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN, arrays of equal dtype and values, dicts in any order."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f")))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@pytest.fixture
def both(tmp_path):
    """(packed, groups): the same run written in both layouts, each as ``run.h5``."""
    (tmp_path / "packed").mkdir()
    (tmp_path / "groups").mkdir()
    return (_write(tmp_path / "packed" / "run.h5", schema.RANK_LAYOUT_PACKED, events=_events()),
            _write(tmp_path / "groups" / "run.h5", schema.RANK_LAYOUT_GROUPS, events=_events()))


def test_both_layouts_read_into_the_same_run(both):
    packed, groups = (read_run(p) for p in both)
    assert packed.rank_layout == schema.RANK_LAYOUT_PACKED
    assert groups.rank_layout == schema.RANK_LAYOUT_GROUPS
    with h5py.File(both[0]) as f:
        assert f.attrs[schema.RANK_LAYOUT_ATTR] == schema.RANK_LAYOUT_PACKED
        assert not any(name.isdigit() for name in f[schema.RANKS_GROUP])  # no rank groups
        assert f["ranks/t_comm"].shape == (sum(COUNTS.values()),)
    with h5py.File(both[1]) as f:
        assert schema.RANK_LAYOUT_ATTR not in f.attrs  # as older files: no attribute
        assert sorted(f[schema.RANKS_GROUP]) == [f"{r:05d}" for r in COUNTS]
    for f in dataclasses.fields(Run):
        if f.name in ("path", "rank_layout", "_packed"):
            continue
        assert _same(getattr(packed, f.name), getattr(groups, f.name)), f.name
    assert schema.RANK_LAYOUT_ATTR not in packed.attrs  # storage, not an attribute of the run
    assert packed.steps == groups.steps == COUNTS
    assert set(packed.ranks[2]) == set(schema.RANK_COLUMNS) and packed.ranks[2]["step"].size == 0
    assert packed.rank_attrs[2] == {"hostname": "node-b", "node": 1,
                                    **{k: packed.rank_attrs[2][k] for k in packed.rank_attrs[2]
                                       if k in schema.FLOAT_ATTRS}}
    assert "device" not in packed.rank_attrs[3] and packed.rank_attrs[3]["hostname"] == "nöde-ü"
    # the one table: as stored for the packed file, concatenated for the groups one
    a, b = packed.packed, groups.packed
    assert _same(a.ranks, b.ranks) and _same(a.counts, b.counts) and _same(
        dict(a.columns), dict(b.columns))
    assert a.ranks.tolist() == sorted(COUNTS) and a.counts.tolist() == list(COUNTS.values())
    # the events, from /ranks/events and from /ranks/<r>/events
    ea, eb = read_events(both[0]), read_events(both[1])
    assert sorted(ea) == sorted(eb) == [0, 1, 3]
    for rank in ea:
        assert _same(ea[rank].columns, eb[rank].columns) and ea[rank].names == eb[rank].names
        assert ea[rank].attrs == eb[rank].attrs and ea[rank].stride == 1 + rank


def test_report_and_trace_are_the_same_from_both_layouts(both, capsys):
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    outputs = []
    for path in both:
        texts = []
        for fmt in ("md", "json", "csv"):
            assert report_command.run(parser.parse_args([path, "--format", fmt, "--per-rank"])) == 0
            texts.append(capsys.readouterr().out.replace(path, "RUN"))
        outputs.append(texts)
    assert outputs[0] == outputs[1]
    assert "## Collectives" in outputs[0][0]
    traces = [trace_events(read_run(p))["traceEvents"] for p in both]
    assert traces[0] == traces[1]
    assert any(e.get("cat") == "collective" for e in traces[0])


def test_a_partial_packed_run_lacks_ranks_and_a_complete_one_may_not(tmp_path):
    partial = _write(tmp_path / "partial.h5", "packed", {0: 3, 2: 4}, complete=False)
    run = read_run(partial)
    assert run.complete is False and sorted(run.ranks) == [0, 2] and run.world_size == 4
    assert run.stopped_by == "SIGTERM"
    broken = _write(tmp_path / "broken.h5", "packed", {0: 3, 2: 4})
    with pytest.raises(RunFileError, match=r"is incomplete: rank 1 missing from /ranks/rank$"):
        read_run(broken)


def _edit(path, edit) -> str:
    with h5py.File(path, "a") as f:
        edit(f)
    return path


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda f: f["ranks"].__delitem__("t_comm"), "is incomplete: missing /ranks/t_comm"),
    (lambda f: (f["ranks"].__delitem__("t_comm"),
                f["ranks"].create_dataset("t_comm", data=np.zeros(3))),
     "is malformed: /ranks/t_comm has shape (3,), expected (16,)"),
    (lambda f: f["ranks"].__delitem__("rows"), "is incomplete: missing /ranks/rows"),
    (lambda f: (f["ranks"].__delitem__("rank"),
                f["ranks"].create_dataset("rank", data=[0, 2, 1, 3])),
     "is malformed: /ranks/rank is not ascending distinct ranks >= 0"),
    (lambda f: (f["ranks"].__delitem__("hostname"),
                f["ranks"].create_dataset("hostname", data=["a"], dtype=h5py.string_dtype())),
     "is malformed: /ranks/hostname has shape (1,), expected (4,)"),
    (lambda f: f.__delitem__("ranks"), "is incomplete: missing /ranks"),
    (lambda f: f.attrs.__setitem__(schema.RANK_LAYOUT_ATTR, "columns"),
     "has rank_layout 'columns', expected one of packed, groups"),
])
def test_a_broken_packed_file_is_one_line_naming_what_is_wrong(tmp_path, edit, problem):
    path = _edit(_write(tmp_path / "run.h5", "packed"), edit)
    with pytest.raises(RunFileError) as info:
        read_run(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(path) and message.endswith(problem)


def test_the_writer_refuses_a_rank_whose_columns_differ_in_length(tmp_path):
    rows = {0: _rank_rows(0, 3)}
    rows[0]["t_wait"] = rows[0]["t_wait"][:2]
    with pytest.raises(ValueError, match="rank 0's step column t_wait has 2 rows"):
        write_run_file(tmp_path / "x.h5", ROOT, rows, {}, _evals(0), 1.0, None)
    assert not (tmp_path / "x.h5").exists()
    with pytest.raises(ValueError, match="unknown rank layout"):
        write_run_file(tmp_path / "x.h5", ROOT, {}, {}, _evals(0), 1.0, None, layout="flat")


def test_packed_rows_reduce_as_numpy_does_per_rank():
    rng = np.random.default_rng(7)
    counts = [3, 0, 8, 1, 12, 0, 5, 9]
    ranks = {r * 3: {"v": rng.random(n), "k": rng.integers(0, 4, n)}
             for r, n in enumerate(counts)}
    ranks[6]["v"][4] = NAN  # a NaN makes that rank's median and max NaN, as np.median's
    table = PackedRows.from_ranks(ranks)
    assert table.ranks.tolist() == sorted(ranks) and table.counts.tolist() == counts
    v, k = table.column("v"), table.column("k", np.int64)
    keep = table.position >= 2  # past a two-step warm-up
    for name, got in (("sum", table.sum(v)), ("mean", table.mean(v)),
                      ("median", table.median(v)), ("max", table.max(v)),
                      ("median_kept", table.median(v, keep)), ("mean_kept", table.mean(v, keep)),
                      ("distinct", table.distinct(k)), ("any", table.any(k > 2))):
        want = []
        for r in sorted(ranks):
            x, y = ranks[r]["v"], ranks[r]["k"]
            want.append({"sum": x.sum(), "any": bool(np.any(y > 2)),
                         "distinct": np.unique(y).size,
                         "mean": x.mean() if x.size else NAN,
                         "median": np.median(x) if x.size else NAN,
                         "max": x.max() if x.size else NAN,
                         "median_kept": np.median(x[2:]) if x[2:].size else NAN,
                         "mean_kept": x[2:].mean() if x[2:].size else NAN}[name])
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float),
                                   rtol=1e-12, err_msg=name)
    uniform = PackedRows.from_ranks({r: {"v": rng.random(4)} for r in range(5)})
    assert uniform.uniform and not table.uniform
    np.testing.assert_allclose(uniform.median(uniform.column("v")),
                               np.median(uniform.column("v").reshape(5, 4), axis=1))
    assert _same(table.split(v)[6], ranks[6]["v"])


# ---------------------------------------------------------------- trace: a rank sample


def _wide_run(path, world_size: int, slow: int) -> str:
    rows, attrs = {}, {}
    for rank in range(world_size):
        cols = {name: np.zeros(3, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
        cols["step"] = np.arange(3)
        cols["t_compute"] = np.full(3, 0.03 if rank == slow else 0.01)
        cols["t_comm"] = np.full(3, 0.001)
        cols["t_start"] = np.arange(3) * 0.04
        cols["samples"] = np.full(3, 32)
        rows[rank] = cols
        attrs[rank] = {"hostname": f"node-{rank // 4}", "node": rank // 4, "device": "cpu"}
    write_run_file(path, {**ROOT, "algorithm": "ssgd", "world_size": world_size}, rows, attrs,
                   _evals(2), 0.2, None)
    return str(path)


def _trace(path: str, out, *extra: str) -> dict:
    parser = argparse.ArgumentParser()
    trace_command.add_arguments(parser)
    assert trace_command.run(parser.parse_args([path, "-o", str(out), *extra])) == 0
    return json.loads(out.read_text())


def _traced_ranks(trace: dict) -> list[int]:
    return sorted(e["pid"] for e in trace["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "process_name")


def test_trace_of_more_ranks_than_max_ranks_is_a_sample_and_says_so(tmp_path, capsys):
    path = _wide_run(tmp_path / "wide.h5", 40, slow=23)
    trace = _trace(path, tmp_path / "t.json", "--max-ranks", "8")
    err = capsys.readouterr().err
    assert "40 ranks, more than --max-ranks 8: tracing a sample of 8 ranks" in err
    assert "the slowest, rank 23" in err and "--max-ranks 0 traces every rank" in err
    assert "of 8 ranks ->" in err
    sample = trace["otherData"]["ranks_sampled"]
    assert sample["of"] == 40 and sample["max_ranks"] == 8 and sample["slowest"] == 23
    assert len(sample["ranks"]) == 8 and {0, 23, 39} <= set(sample["ranks"])
    assert _traced_ranks(trace) == sample["ranks"]
    assert {e["pid"] for e in trace["traceEvents"] if e.get("cat") == "phase"} == set(
        sample["ranks"])
    gaps = np.diff([r for r in sample["ranks"] if r != 23])  # evenly spaced, but for 23
    assert gaps.max() - gaps.min() <= 1
    assert any(e["ph"] == "i" for e in trace["traceEvents"])  # rank 0's evaluations
    # every rank: no sample, nothing said
    full = _trace(path, tmp_path / "full.json", "--max-ranks", "0")
    assert _traced_ranks(full) == list(range(40)) and "ranks_sampled" not in full["otherData"]
    assert "sample" not in capsys.readouterr().err
    default = _trace(path, tmp_path / "default.json")  # 40 <= DEFAULT_MAX_RANKS
    assert DEFAULT_MAX_RANKS >= 40 and len(_traced_ranks(default)) == 40


def test_rank_sample_keeps_the_first_and_the_slowest_and_fits_the_limit(tmp_path):
    run = read_run(_wide_run(tmp_path / "w.h5", 12, slow=0))  # the slowest is the first
    assert sample_ranks(run, 12) is None and sample_ranks(run, 0) is None
    for limit in (1, 2, 3, 5, 11):
        ranks = sample_ranks(run, limit)["ranks"]
        assert len(ranks) == limit and ranks[0] == 0, limit
    run = read_run(_wide_run(tmp_path / "v.h5", 12, slow=5))
    assert sample_ranks(run, 2)["ranks"] == [0, 5]
    assert sample_ranks(run, 1)["ranks"] == [0]  # room for the first rank only


def test_trace_rejects_a_negative_max_ranks(tmp_path, capsys):
    path = _wide_run(tmp_path / "w.h5", 4, slow=1)
    parser = argparse.ArgumentParser()
    trace_command.add_arguments(parser)
    assert trace_command.run(parser.parse_args([path, "-o", str(tmp_path / "t.json"),
                                         "--max-ranks", "-1"])) == 2
    assert "--max-ranks -1: need N >= 0" in capsys.readouterr().err
