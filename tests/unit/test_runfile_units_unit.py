"""Run files that explain themselves, a tidy per-step table, results files that move: the tests
that launch nothing and load no MPI.

Split off e2e/test_runfile_units.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import math

import h5py
import numpy as np

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.experiment.results_paths import (
    relative_paths,
    resolved_paths,
    same_plan,
)


def test_schema_describes_every_column_once():
    packed_index = {"rank", "rows"}
    assert set(schema.DATASET_INFO[schema.RANKS_GROUP]) == \
        set(schema.RANK_COLUMNS) | set(schema.RANK_ATTRS) | packed_index
    assert set(schema.RANK_ATTR_DTYPES) == set(schema.RANK_ATTRS)
    assert set(schema.DATASET_INFO[schema.EVENTS_GROUP]) == \
        set(schema.EVENT_COLUMNS) | set(schema.EVENT_COUNT_ATTRS) | packed_index
    for group in (schema.EVAL_GROUP, schema.EVAL_LOCAL_GROUP):
        assert set(schema.DATASET_INFO[group]) == set(schema.EVAL_COLUMNS)
    for table in schema.DATASET_INFO.values():
        for name, (units, description) in table.items():
            assert units and description and "\n" not in description, name
    assert schema.DATASET_INFO[schema.RANKS_GROUP]["t_comm"][0] == "s"


def test_unknown_attributes_are_nan_or_absent_and_old_empty_strings_read_as_absent(tmp_path):
    from syncbench.bench.train.recorder import write_run_file

    rows = {name: np.zeros(2, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
    evals = {name: np.zeros(0, dtype=dtype) for name, dtype in schema.EVAL_COLUMNS.items()}
    root = {"algorithm": "ssgd", "world_size": 2, "cupy_version": None, "slurm_job_id": "",
            "config": "{}"}
    attrs = {0: {"hostname": "h", "slowdown": None}, 1: {"slowdown": 2.0, "node": 0}}
    out = tmp_path / "unknown.h5"
    write_run_file(out, root, {0: rows, 1: rows}, attrs, evals, 1.0, None)
    with h5py.File(out, "r") as f:
        for name in ("cupy_version", "slurm_job_id", "git_sha", "scaling_mode"):
            assert name not in f.attrs, name
        assert math.isnan(f.attrs["load_begin"]) and math.isnan(f.attrs["t_end_unix"])
        ranks = f[schema.RANKS_GROUP]  # packed: an unknown float NaN, string "", integer -1
        assert math.isnan(ranks["slowdown"][0]) and ranks["slowdown"][1] == 2.0
        assert ranks["hostname"].asstr()[()].tolist() == ["h", ""]
        assert ranks["node"][()].tolist() == [-1, 0]
        assert "device" not in ranks and "slowdown_mode" not in ranks  # no rank knows them
        assert schema.STOPPED_BY_ATTR not in f[schema.SUMMARY_GROUP].attrs
    run = read_run(out)
    assert run.rank_attrs[0]["hostname"] == "h" and "node" not in run.rank_attrs[0]
    assert "hostname" not in run.rank_attrs[1] and run.rank_attrs[1]["node"] == 0
    assert math.isnan(run.rank_attrs[0]["slowdown"]) and "device" not in run.rank_attrs[1]
    # the groups layout of older files: unknown attributes NaN or absent too
    out = tmp_path / "unknown-groups.h5"
    write_run_file(out, root, {0: rows, 1: rows}, attrs, evals, 1.0, None, layout="groups")
    with h5py.File(out, "r") as f:
        assert schema.RANK_LAYOUT_ATTR not in f.attrs
        rank = f[schema.rank_group(0)]
        assert math.isnan(rank.attrs["slowdown"]) and rank.attrs["hostname"] == "h"
        assert "device" not in rank.attrs and "node" not in rank.attrs
    # an older file's "" is read as missing
    with h5py.File(out, "a") as f:
        f.attrs["cupy_version"] = ""
        f[schema.rank_group(0)].attrs["device"] = ""
        f[schema.SUMMARY_GROUP].attrs[schema.STOPPED_BY_ATTR] = ""
    run = read_run(out)
    assert "cupy_version" not in run.attrs and "device" not in run.rank_attrs[0]
    assert schema.STOPPED_BY_ATTR not in run.summary_extra and run.stopped_by == ""
    assert run.attrs["algorithm"] == "ssgd" and run.rank_attrs[0]["hostname"] == "h"


def test_results_paths_are_relative_to_the_file_and_resolve_against_it(tmp_path):
    folder = tmp_path / "out"
    plan = [{"run_id": "a", "path": str(folder / "a.h5"),
             "args": ["--seed", "0", "--out", str(folder / "a.h5")]}]
    state = {"plan": plan, "runs": [{"path": str(folder / "a.h5"), "note": "-> kept"}]}
    stored = relative_paths(state, folder)
    assert stored["plan"][0]["path"] == "a.h5" and stored["runs"][0]["path"] == "a.h5"
    assert stored["plan"][0]["args"] == ["--seed", "0", "--out", "a.h5"]
    assert stored["runs"][0]["note"] == "-> kept"
    moved = tmp_path / "moved"
    back = resolved_paths(stored, moved)
    assert back["runs"][0]["path"] == str(moved / "a.h5")
    # moved: the stored plan is the plan made for the new folder; an older file's
    # absolute paths still match where they point
    new_plan = [{**plan[0], "path": str(moved / "a.h5"),
                 "args": ["--seed", "0", "--out", str(moved / "a.h5")]}]
    assert same_plan(stored["plan"], new_plan, moved)
    assert same_plan(plan, plan, folder) and not same_plan(plan, new_plan, moved)
    assert not same_plan(stored["plan"], [{**new_plan[0], "run_id": "b"}], moved)
