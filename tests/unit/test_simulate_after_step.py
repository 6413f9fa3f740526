"""``simulate --calibrate-after-step`` (``bench/simulate/after_step.py``): the compressing
reducers' short collectives at their measured time after a training step. The file
round-trips from ``after_idle --out``'s layout, sizes between the measured ones are
interpolated log-log, sizes outside, other world sizes and the all-to-all are left to
the chain model, a blocking step's comm is exactly the calibrated times (plus a 1-rank
codec run's harness cost), and bad files are one line each.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from syncbench.bench.simulate import compressed
from syncbench.bench.simulate.after_step import load_after_step
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import Stragglers, from_profile
from tests.unit.test_simulate_compressed import config, timeline_shapes

SIZES = [2048, 8192, 32768]


def calibration(tmp_path, name="after.json", **changes) -> str:
    """An ``after_idle --out`` file: allreduce 40/60/90 us, allgather 30/30/50 us."""
    data = {"world_size": 2, "model": "mlp", "batch_size": 64, "gap_ms": None,
            "repeats": 100, "sizes": SIZES,
            "ops": {"allreduce": {"back_to_back_s": [1e-5, 2e-4, 1e-3],
                                  "after_s": [40e-6, 60e-6, 90e-6]},
                    "allgather": {"back_to_back_s": [1e-5, 2e-4, 1e-3],
                                  "after_s": [30e-6, 30e-6, 50e-6]}}}
    data.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_sizes_between_the_measured_ones_are_interpolated_log_log(tmp_path):
    after = load_after_step(calibration(tmp_path))
    assert after.seconds("allreduce", 8192, 2) == pytest.approx(60e-6)
    middle = math.sqrt(2048 * 8192)  # halfway in log size: the geometric mean in time
    assert after.seconds("allreduce", middle, 2) == pytest.approx(math.sqrt(40e-6 * 60e-6))
    assert after.seconds("allgatherv", 8192, 2) == pytest.approx(30e-6)


def test_what_the_calibration_does_not_cover_is_left_to_the_chain_model(tmp_path):
    after = load_after_step(calibration(tmp_path))
    assert after.seconds("allreduce", 1024, 2) is None  # below the measured sizes
    assert after.seconds("allreduce", 65536, 2) is None  # above: the bucket may not pass it
    assert after.seconds("allreduce", 8192, 4) is None  # another world size
    assert after.seconds("alltoallv", 8192, 2) is None  # not measured


def run_blocking(spec: str, flags: list[str], harness_s: float = 0.0, steps: int = 3):
    cfg = config("--compress", spec, "--comm", "blocking", "--powersgd-start", "0", *flags)
    w = dataclasses.replace(from_profile("mlp"), mean_calls_s=harness_s,
                            tensor_shapes=timeline_shapes(),
                            extra={"codec_source": "one.h5", "codec_world_size": 1})
    local = LocalTimes(w, 2, [1.0] * 2, Stragglers(), 0)
    timeline = compressed.compressed_ssgd(cfg, local, steps, lambda phase: 1e-3)
    rows = timeline.rows.arrays()
    return np.min([rows[k]["t_comm"] for k in rows], axis=0), timeline.notes


def test_a_blocking_chain_takes_the_calibrated_times_plus_the_harness(tmp_path):
    """PowerSGD on mlp at rank 2: P of 10,920 B and Q of 3,152 B, each at its interpolated
    time, plus the 1-rank codec run's comm and wait; without the flag every stage
    takes the clock's 1 ms."""
    path = calibration(tmp_path)
    comm, notes = run_blocking("powersgd:2", ["--calibrate-after-step", path], 25e-6)
    after = load_after_step(path)
    expected = after.seconds("allreduce", 10920, 2) + after.seconds("allreduce", 3152, 2)
    assert np.allclose(comm, expected + 25e-6)
    assert "after_step" in notes and path in notes["after_step"]
    plain, plain_notes = run_blocking("powersgd:2", [], 25e-6)
    assert np.all(plain >= 2e-3) and "after_step" not in plain_notes


def test_a_chain_the_calibration_does_not_cover_keeps_its_stages(tmp_path):
    """top-k on mlp gathers 18,816 B a rank: above a calibration that ends at 16 KB."""
    path = calibration(tmp_path, sizes=[2048, 8192, 16384])
    comm, notes = run_blocking("topk:0.01", ["--calibrate-after-step", path])
    assert np.all(comm >= 1e-3 - 1e-12)  # the clock's 1 ms, to rounding
    assert notes["after_step"] == (f"not applied: {path} does not cover allgather of "
                                   "18816 B on 2 ranks")
    wider = calibration(tmp_path, "wider.json")
    covered, _ = run_blocking("topk:0.01", ["--calibrate-after-step", wider])
    assert np.allclose(covered, load_after_step(wider).seconds("allgather", 18816, 2))


@pytest.mark.parametrize("changes, words", [
    ({"model": None}, "measured after a spin"),
    ({"sizes": [2048, 2048, 4096]}, "increasing positive sizes"),
    ({"ops": {"alltoall": {"after_s": [1, 2, 3]}}}, "not an after_idle calibration"),
    ({"ops": {"allreduce": {"after_s": [1e-5, -1, 2e-5]}}}, "positive time"),
    ({"sizes": "many"}, "not an after_idle calibration"),
    ({"sizes": 5}, "not an after_idle calibration"),
])
def test_a_bad_calibration_is_one_line_naming_the_flag(tmp_path, changes, words):
    path = calibration(tmp_path, f"bad-{len(str(changes))}.json", **changes)
    with pytest.raises(ValueError, match=words) as err:
        load_after_step(path)
    assert str(err.value).startswith(f"--calibrate-after-step {path}: ")
    assert "\n" not in str(err.value)


def test_a_missing_or_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="--calibrate-after-step .*missing.json: No such file"):
        load_after_step(str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_bytes(b"\x00not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        load_after_step(str(tmp_path / "x.json"))
