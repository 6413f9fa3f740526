"""Simulated ASGD traffic (``bench/simulate/asgd.py``): the code's epochs, counter and
accumulates: the tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_simulate_asgd.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from sim_helpers import needs_simgrid
from sim_helpers import simulate as run_simulate

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.simulate.asgd import (
    DEFAULT_EPOCH_US,
    DEFAULT_SERVICE_US,
    counter_bound,
)

#: The mlp profile: parameters (float32) and batch.
MLP_BYTES, MLP_BATCH = 235146 * 4, 64


def simulate(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_simulate("--algorithm", "asgd", *flags, timeout=timeout)


def notes(path) -> dict:
    """The run file's ``simulation`` attribute (the timeline's notes among it)."""
    return json.loads(read_run(path).attrs[schema.SIM_RUN_ATTR])


def samples_per_s(proc: subprocess.CompletedProcess) -> float:
    assert proc.returncode == 0, proc.stderr
    return float(re.search(r"([0-9.e+]+) samples/s", proc.stdout).group(1))


@needs_simgrid
def test_simulated_pull_grows_by_the_owners_epochs(tmp_path):
    pulls = {}
    for n in (256, 1024):
        out = tmp_path / f"{n}.h5"
        proc = simulate("--np", str(n), "--steps", "2", "--rma-epoch-us", "5", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        pulls[n] = notes(out)
        assert pulls[n]["epochs_per_access"] == n
    grow = pulls[1024]["pull_s"] - pulls[256]["pull_s"]
    assert grow == pytest.approx(768 * 5e-6, rel=0.02)
    assert pulls[1024]["pull_s"] > 1024 * 5e-6


@needs_simgrid
def test_simulated_throughput_is_bounded_by_the_counter(tmp_path):
    out = tmp_path / "c.h5"
    rate = samples_per_s(simulate("--np", "1024", "--steps", "4", "--out", str(out)))
    bound = MLP_BATCH * counter_bound(DEFAULT_SERVICE_US * 1e-6)
    assert rate <= bound * 1.001
    # at 1024 ranks the queue is the bottleneck: busy more than 0.9 of the run, the rest
    # the first claims and pulls of 4 steps (mlp's measured 1.24 ms step: 0.87 of the bound)
    assert rate > 0.8 * bound
    assert notes(out)["counter_busy_share"] > 0.9


@needs_simgrid
def test_simulated_push_applies_the_accumulate_rate(tmp_path):
    out = tmp_path / "a.h5"
    rate = 1e8  # bytes/s rank 0 reduces into the single window
    proc = simulate("--np", "64", "--steps", "4", "--ps-layout", "single", "--accumulate-rate",
                    str(rate), "--out", str(out))
    bound = MLP_BATCH * rate / MLP_BYTES  # one owner: R / P pushes per second
    assert samples_per_s(proc) <= bound * 1.001
    assert samples_per_s(proc) > 0.8 * bound
    info = notes(out)
    assert info["push_s"] >= MLP_BYTES / rate and info["accumulate_rate"] == rate


@needs_simgrid
@pytest.mark.slow
def test_16384_ranks_stay_within_the_counter_bound():
    rate = samples_per_s(simulate("--np", "16384", "--steps", "20", timeout=600))
    # 5 atomics per step, one at a time at rank 0: 8.5e6 samples/s at most (was 1.12e9)
    assert rate <= MLP_BATCH * counter_bound(DEFAULT_SERVICE_US * 1e-6) * 1.001
    # and no more than each worker's own epochs allow: 2 x 16,384 per step
    assert rate <= 16384 * MLP_BATCH / (2 * 16384 * DEFAULT_EPOCH_US * 1e-6)
