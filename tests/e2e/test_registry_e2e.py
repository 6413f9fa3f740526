"""Invariants every registered strategy keeps, looped over the registry: the tests that launch
jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_registry.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import run_mpi, slow_unless
from sim_helpers import needs_simgrid, simulate
from test_registry import STRATEGIES, Throwaway

from syncbench.algorithms.registry import ALGORITHMS, PLUGINS_ENV
from syncbench.analysis import schema
from syncbench.analysis.report import report_rows
from syncbench.analysis.runfile import read_run
from syncbench.analysis.trace import trace_events

#: Optional flags that make a strategy do its characteristic thing within a
#: tiny budget (a strategy not named here runs with its defaults).
QUICK: dict[str, list[str]] = {
    "odsgd": ["--warmup-steps", "2"],  # its Iallreduce is in flight from step 2 on
    "localsgd": ["--period", "4"],
    "oscars": ["--period", "2"],
    "slowmo": ["--period", "4"],
    "diloco": ["--inner-steps", "4", "--sync-warmup", "2", "--lr", "0.002"],
    # one rank per group stands in for a node each (every rank here shares one host)
    "hierarchical": ["--group-size", "1", "--node-period", "2", "--global-period", "4"],
    # meeting points (evaluations, checkpoints) within the 16 steps of an epoch
    "adpsgd": ["--meet-every", "4"],
}


#: Phase where the injected fault fires (default compute): ASGD's RMA epochs are comm.
FAULT_PHASE: dict[str, str] = {"asgd": "comm"}


#: Step where it fires (default 6). Where ranks take different numbers of steps, rank 1
#: may never reach step 6 of the tiny budget (seen under Open MPI): Oscars gives a slow
#: rank fewer local steps after round 0 (``--period`` steps for every rank), and an ASGD
#: worker takes the tickets it claims first. Step 1 is in round 0 / the second push.
FAULT_STEP: dict[str, int] = {"oscars": 1, "asgd": 1}


#: (--checkpoint-every, step of rank 1's fault) of the crash-and-resume test. An ASGD
#: worker's share of the 64 tickets is uneven on a loaded host, so its fault fires early,
#: at step 12: any rank's step 12 comes after the first pause (every 4 x 2 = 8 tickets,
#: a barrier of all ranks), so a checkpoint always precedes the crash.
CRASH: dict[str, tuple[int, int]] = {"asgd": (4, 12)}


SAMPLES, BATCH = 512, 16


SMALL = ["--dataset", "synthetic", "--synthetic-samples", str(SAMPLES),
         "--batch-size", str(BATCH), "--progress", "never"]


#: Seconds from launch within which a job with a failing rank must have ended.
ABORT_BOUND_S = 20.0


def flags(name: str, *extra: str) -> list[str]:
    return [*SMALL, "--algorithm", name, *QUICK.get(name, []), *extra]


def _plugin_env() -> dict[str, str]:
    """The environment that imports ``tests/unit/test_registry.py`` in a ``syncbench``
    process (it registers Throwaway; it imports ``tests/helpers.py``)."""
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(tests / "unit"), str(tests),
                                         os.environ.get("PYTHONPATH", "")]))
    return {PLUGINS_ENV: "test_registry", "PYTHONPATH": path}


def _launch(np_: int, *args: str, timeout: float = 90):
    """``run_mpi`` with this module imported in every rank."""
    return run_mpi(np_, *args, timeout=timeout, env=_plugin_env())


#: The strategies whose launched tests run in ``make test`` (the others' under ``make
#: test-all``): SSGD's Allreduce and ASGD's windows (OD-SGD's checkpoint with a
#: reduction in flight resumes in test_odsgd_mpi, in process).
LAUNCHED_FAST = {"ssgd", "asgd"}


@pytest.mark.mpi_skip
@pytest.mark.parametrize("name", slow_unless(STRATEGIES, {"ssgd", "asgd", "throwaway"}))
def test_a_rank_that_raises_ends_the_job(name):
    fault = f"1:{FAULT_STEP.get(name, 6)}:{FAULT_PHASE.get(name, 'compute')}"
    started = time.monotonic()
    proc = _launch(4, "train", *flags(name, "--inject-fault", fault), timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert elapsed < ABORT_BOUND_S, f"job took {elapsed:.1f} s to end"
    assert "syncbench: rank 1: InjectedFault" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.mpi_skip
@pytest.mark.parametrize("name", slow_unless(
    [n for n in STRATEGIES if ALGORITHMS[n].traits.supports_checkpoint], LAUNCHED_FAST))
def test_resume_after_a_crash(tmp_path, name):
    """A crash after a checkpoint, then ``--resume``: the budget is consumed once.

    A deterministic strategy ends with the parameters and rows of an
    uninterrupted run.
    """
    cls = ALGORITHMS[name]
    run_flags = flags(name, "--epochs", "2", "--dtype", "float64", "--eval-every", "0.5",
                      "--seed", "3")
    out = tmp_path / "crash.h5"
    every, fault_step = CRASH.get(name, (8, 20))
    crash = _launch(2, "train", *run_flags, "--out", str(out), "--checkpoint-every",
                    str(every), "--inject-fault", f"1:{fault_step}")
    assert crash.returncode != 0 and not out.exists()
    resumed = _launch(2, "train", *run_flags, "--out", str(out), "--resume",
                      "--save-model", str(tmp_path / "resumed.npy"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    b = read_run(out)
    assert b.complete and not (tmp_path / "crash.h5.parts").exists()
    budget = 2 * (SAMPLES // 2 // BATCH) * BATCH * 2
    assert sum(int(rows["samples"].sum()) for rows in b.ranks.values()) == budget
    if not cls.traits.deterministic:
        return
    full = _launch(2, "train", *run_flags, "--out", str(tmp_path / "full.h5"),
                   "--save-model", str(tmp_path / "full.npy"))
    assert full.returncode == 0, full.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "full.npy"))
    a = read_run(tmp_path / "full.h5")
    for rank in a.ranks:
        np.testing.assert_array_equal(a.ranks[rank]["step"], b.ranks[rank]["step"])
        np.testing.assert_array_equal(a.ranks[rank]["loss"], b.ranks[rank]["loss"])
    np.testing.assert_array_equal(a.eval["accuracy"], b.eval["accuracy"])


def _phases_of_step(run: Any, rank: int, step: int) -> list[str]:
    """The phases ``syncbench trace`` draws for one step of one rank, in time order."""
    events = [e for e in trace_events(run)["traceEvents"]
              if e.get("cat") == "phase" and e["pid"] == rank and e["args"]["step"] == step]
    return [e["name"] for e in sorted(events, key=lambda e: e["ts"])]


@needs_simgrid
@pytest.mark.mpi_skip
def test_the_throwaway_strategy_is_simulated_traced_and_labelled(tmp_path):
    """``syncbench simulate --algorithm throwaway``: a run file with Throwaway's traits,
    whose trace follows Throwaway's step order and whose tables carry its label."""
    out = tmp_path / "throwaway.h5"
    proc = simulate("--algorithm", "throwaway", "--np", "4", "--steps", "3",
                    "--comm", "blocking", "--slowdown", "1,1,1,3", "--sum-gradients",
                    "--out", str(out), env=_plugin_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(out)
    assert run.attrs["algorithm"] == "throwaway"
    assert run.attrs[schema.TRAITS_ATTR] == Throwaway.traits.in_file().to_json()
    ran = _phases_of_step(run, 3, 0)
    assert {"comm", "delay"} <= set(ran)  # the slowed rank waits for no one, then straggles
    assert ran == [p for p in Throwaway.traits.step_order if p in ran]
    assert [row["algorithm"] for row in report_rows([str(out)])] == ["throwaway+sum"]


@pytest.mark.mpi_skip
def test_a_run_file_carries_its_strategys_traits_to_trace_and_tables(tmp_path):
    """Without SimGrid: the simulator's writer, given rows, writes Throwaway's traits."""
    from syncbench.bench.simulate.timeline import StepRows
    from syncbench.bench.simulate.writer import write_simulated_run

    rows = StepRows(2)
    for j in range(2):
        rows.add(step=j, t_start=np.full(2, 0.5 * j), t_data=0.01, t_compute=0.1,
                 t_comm=0.05, t_delay=np.array([0.0, 0.2]), t_update=0.01, samples=16)
    out = tmp_path / "throwaway.h5"
    write_simulated_run(str(out), algorithm="throwaway", world_size=2,
                        config={"sum_gradients": True}, rows=rows.arrays(), wall_s=1.0,
                        platform={}, workload={}, simulation={}, extra_root={})
    run = read_run(out)
    assert schema.strategy_traits(run.attrs) == Throwaway.traits.in_file()
    assert _phases_of_step(run, 1, 1) == ["data", "compute", "comm", "delay", "update"]
    assert [row["algorithm"] for row in report_rows([str(out)])] == ["throwaway+sum"]
