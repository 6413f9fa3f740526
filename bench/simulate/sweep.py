"""``syncbench sweep --simulate``: each point of a sweep is a simulation, not an mpiexec.

The sweep plans its points as for real runs (strong: global batch split over
N; weak: fixed per-rank batch and a budget that grows with N) and calls
:func:`launch_simulated` for each: ``syncbench simulate`` with the point's
algorithm, N, per-rank batch, scaling mode and output file, plus every flag
the sweep does not know (``--workload``, ``--platform``, ``--stragglers``,
``--steps``, the strategies' flags). ``--steps S`` keeps S steps per rank at
every N (then the sweep's ``--epochs`` is not passed).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any


def launch_simulated(run: Any, sim_args: list[str], timeout: float | None,
                     complete: Any) -> None:
    """Simulate one planned point; record status, note and seconds in ``run`` (as ``launch``)."""
    flags = ["--algorithm", run.algorithm, "--np", str(run.np), "--batch-size",
             str(run.batch_size), "--scaling-mode", run.mode, "--out", run.path,
             "--overwrite", *sim_args]
    if "--steps" in sim_args or any(a.startswith("--steps=") for a in sim_args):
        run.epochs = None
    elif run.epochs is not None:
        flags += ["--epochs", repr(run.epochs)]
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "syncbench", "simulate", *flags],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        run.status, run.note = "failed", f"timed out after {timeout:g} s"
    else:
        run.returncode = proc.returncode
        lines = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
        if proc.returncode == 0 and complete(run)[0]:
            run.status, run.note = "ran", lines[-1] if lines else ""
        else:
            err = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
            run.status = "failed"
            run.note = err[-1] if err else f"exit status {proc.returncode}"
    run.seconds = round(time.perf_counter() - started, 3)
