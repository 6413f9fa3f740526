"""``python -m syncbench.analysis.rma_waits``: ASGD's counter epochs beside rank 0's window
epochs, on a hand-made run file with ``--events on``'s group (write_run_file): a counter
epoch of rank 1 posted in rank 0's push and ending with it, one posted in its pull and
ending 1 ms after it, one posted apart; a run without events, or without counter events,
or a missing file, is one line and exit 2."""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.analysis.collectives import read_events
from syncbench.analysis.rma_waits import main, rank_waits
from syncbench.bench.train.recorder import write_run_file

KIND = {name: code for code, name in enumerate(schema.EVENT_KINDS)}


def _events(spans: list[tuple[str, float, float]]) -> tuple[dict[str, np.ndarray], dict]:
    n = len(spans)
    cols = {name: np.zeros(n, dtype=dtype) for name, dtype in schema.EVENT_COLUMNS.items()}
    cols["kind"] = np.array([KIND[k] for k, _, _ in spans], dtype=np.int8)
    cols["t_post"] = np.array([a for _, a, _ in spans])
    cols["t_done"] = np.array([b for _, _, b in spans])
    cols["bytes"] = np.array([8 if k == "rma_counter" else 4096 for k, _, _ in spans])
    return cols, {"capacity": 64, "stride": 1, "recorded": n, "dropped": 0}


def _write(path, events) -> str:
    rows = {r: {"step": np.arange(2), "t_start": np.array([0.0, 0.02]),
                **{f"t_{p}": np.zeros(2) for p in schema.PHASES},
                "loss": np.ones(2), "samples": np.full(2, 8)} for r in (0, 1)}
    for cols in rows.values():
        for name, dtype in schema.RANK_COLUMNS.items():
            cols.setdefault(name, np.zeros(2, dtype=dtype))
    evals = {"t": np.array([0.04]), "step": np.array([2]), "samples_seen": np.array([32]),
             "loss": np.array([1.0]), "accuracy": np.array([0.5])}
    write_run_file(path, {"algorithm": "asgd", "model": "mlp", "dataset": "synthetic",
                          "world_size": 2, "config": {"algorithm": "asgd"}},
                   rows, {r: {"hostname": f"n{r}"} for r in rows}, evals, 0.04, None,
                   events=events)
    return str(path)


MS = 1e-3
RANK0 = [("rma_counter", 0.0, 0.01 * MS), ("rma_pull", 0.1 * MS, 4 * MS),
         ("rma_push", 5 * MS, 9 * MS), ("rma_counter", 9 * MS, 9.05 * MS)]
RANK1 = [("rma_counter", 1 * MS, 5 * MS),      # in rank 0's pull, 1 ms past its end
         ("rma_pull", 5 * MS, 5.5 * MS),
         ("rma_counter", 6 * MS, 9 * MS),      # in rank 0's push, ends with it
         ("rma_counter", 10 * MS, 10.2 * MS),  # apart
         ("rma_push", 11 * MS, 12 * MS)]


def test_a_counter_epoch_is_set_in_the_window_epoch_of_rank_0_it_was_posted_in(tmp_path):
    path = _write(tmp_path / "run.h5", {0: _events(RANK0), 1: _events(RANK1)})
    zero, one = rank_waits(read_events(path))
    assert (zero.counters, one.counters) == (2, 3)
    assert zero.during_push is None and zero.pull_s == pytest.approx(3.9 * MS)
    assert (one.during_push.count, one.during_pull.count, one.apart.count) == (1, 1, 1)
    assert one.during_push.median_s == pytest.approx(3 * MS)
    assert one.during_push.end_after_s == pytest.approx(0.0, abs=1e-12)
    assert one.during_pull.end_after_s == pytest.approx(1 * MS)
    assert one.apart.median_s == pytest.approx(0.2 * MS)
    assert one.pull_s == pytest.approx(0.5 * MS) and one.push_s == pytest.approx(1 * MS)


def test_the_table_prints_each_rank(tmp_path, capsys):
    path = _write(tmp_path / "run.h5", {0: _events(RANK0), 1: _events(RANK1)})
    assert main([path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# {path}"
    assert lines[3].split("|")[1].split() == ["1,", "3.00,", "0.00"]


@pytest.mark.parametrize("case", ["missing", "no events", "no counters"])
def test_a_run_it_cannot_read_is_one_line_and_exit_2(tmp_path, capsys, case):
    path = str(tmp_path / "run.h5")
    if case == "no events":
        _write(path, None)
    elif case == "no counters":
        _write(path, {0: _events(RANK0[1:3]), 1: _events(RANK1[1:2])})
    assert main([path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rma_waits: ") and path in err[0]
