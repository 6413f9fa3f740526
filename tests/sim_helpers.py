"""Helpers of the simulator's tests: the SimGrid skip marker and the subprocesses they run.

Without SimGrid's Python module the marked tests skip, unless
``SYNCBENCH_REQUIRE_SIMGRID`` (``make test``) makes that a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from syncbench.bench.simulate.engine import have_simgrid

REQUIRED = bool(os.environ.get("SYNCBENCH_REQUIRE_SIMGRID"))
needs_simgrid = pytest.mark.skipif(
    not REQUIRED and not have_simgrid(),
    reason="SimGrid's Python module is not installed (make sim)",
)
_ENV = {"OMP_NUM_THREADS": "1"}


def simulate(*flags: str, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``syncbench simulate FLAGS`` in a subprocess (one BLAS thread; ``env`` added)."""
    return subprocess.run([sys.executable, "-m", "syncbench", "simulate", *flags],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **_ENV, **(env or {})})


def python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -c CODE`` (dedented) in a subprocess: a SimGrid engine runs once per process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **_ENV})
