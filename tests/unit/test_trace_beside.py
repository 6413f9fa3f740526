"""``syncbench trace RUN --beside RUN2``: two runs' phases in one trace, each from its own
first step, the second's processes after the first's; and ``simulate --validate
--validate-out``'s file names."""

from __future__ import annotations

import json

import pytest
from test_analysis import write_file

from syncbench.analysis.runfile import read_run
from syncbench.analysis.trace import BESIDE_PID, write_trace
from syncbench.bench.simulate.validate import predicted_path


def test_the_second_run_is_drawn_below_the_first_from_its_own_start(tmp_path):
    measured = write_file(tmp_path / "ssgd-hom-r0.h5", algorithm="ssgd", world_size=2,
                          wall=2.0, steps_per_rank=3)
    predicted = write_file(tmp_path / "predicted-ssgd-hom-r0.h5", algorithm="ssgd",
                           world_size=2, wall=1.0, steps_per_rank=3)
    out = tmp_path / "t.json"
    write_trace(read_run(measured), out, beside=read_run(predicted))
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1, BESIDE_PID, BESIDE_PID + 1}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[0].startswith("measured ssgd-hom-r0.h5: rank 0")
    assert names[BESIDE_PID + 1].startswith("measured predicted-ssgd-hom-r0.h5: rank 1")
    for low, high in ((0, BESIDE_PID), (BESIDE_PID, 2 * BESIDE_PID)):
        starts = [e["ts"] for e in events if e["ph"] == "X" and low <= e["pid"] < high]
        assert min(starts) == 0.0 and len(starts) > 0
    phases = [e for e in events if e.get("cat") == "phase"]
    assert len([e for e in phases if e["pid"] >= BESIDE_PID]) == \
        len([e for e in phases if e["pid"] < BESIDE_PID])
    assert trace["otherData"]["beside"]["source"].endswith("predicted-ssgd-hom-r0.h5")


def test_a_prediction_never_replaces_a_file_unasked(tmp_path):
    path = predicted_path(str(tmp_path / "pred"), "/runs/ssgd-hom-r0.h5", False)
    assert path.endswith("pred/predicted-ssgd-hom-r0.h5")
    open(path, "w").close()
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        predicted_path(str(tmp_path / "pred"), "/runs/ssgd-hom-r0.h5", False)
    assert predicted_path(str(tmp_path / "pred"), "/runs/ssgd-hom-r0.h5", True) == path
    with pytest.raises(ValueError, match="is a file, not a folder"):  # a folder it cannot make
        predicted_path(path, "/runs/ssgd-hom-r0.h5", False)
