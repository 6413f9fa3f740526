"""The unit tier's guard: a test here launches no process and never loads ``mpi4py.MPI``.

That is what makes the tier fast and runnable anywhere (no MPI library, no launcher, no
second core): a unit test computes in the pytest process and asserts on the result.

    python -m pytest -n 2 -m 'not slow' tests/unit          (make test-fast)

- A launch (``subprocess.Popen`` and so ``subprocess.run``, ``os.system``, ``os.fork``,
  ``os.posix_spawn``: ``mpiexec``, a ``syncbench`` command, a compiler) fails the test at
  the call, with a line saying where such a test belongs (``tests/e2e``).
- Importing ``mpi4py.MPI`` (which calls ``MPI_Init``) from a unit module fails at the
  import, and a test after which ``mpi4py.MPI`` is loaded fails, with a line saying where
  it belongs (``tests/mpi_inproc`` for an in-process MPI test, marked ``mpi``).

The guard holds in a session of the unit tier alone (``make test-fast``): where another
tier's modules are collected in the same process, one of them may load ``mpi4py.MPI``
first, and the check after each test sees it already there.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from syncbench.kernels import cpu_native

UNIT = Path(__file__).resolve().parent
_MPI_BEFORE = pytest.StashKey[bool]()


def _unit_module_on_stack() -> str | None:
    """The file name of the innermost unit test module in the current call stack."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.parent == UNIT and path.name.startswith("test_"):
            return path.name
    return None


class _NoMPI:
    """A meta-path finder that refuses ``mpi4py.MPI`` to an import made from a unit module
    (consulted only while ``mpi4py.MPI`` is not yet loaded)."""

    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            module = _unit_module_on_stack()
            if module is not None:
                raise ImportError(f"tests/unit/{module} loads mpi4py.MPI (which starts MPI): "
                                  "an in-process MPI test belongs in tests/mpi_inproc")
        return None


sys.meta_path.insert(0, _NoMPI())


def _refuse(what: str):
    def launch(*args, **kwargs):
        raise AssertionError(f"a unit test launches no process ({what}): "
                             "a test that launches one belongs in tests/e2e")
    return launch


class _RefusedPopen(subprocess.Popen):
    """``subprocess.Popen`` that refuses to start (``subprocess.run`` and ``check_output``
    go through it)."""

    def __init__(self, args, *rest, **kwargs):
        raise AssertionError(f"a unit test launches no process (subprocess.Popen {args!r}): "
                             "a test that launches one belongs in tests/e2e")


_REFUSED = [(subprocess, "Popen", _RefusedPopen),
            # and under it, for a module that imported Popen by name
            (_posixsubprocess, "fork_exec", _refuse("_posixsubprocess.fork_exec"))]
_REFUSED += [(os, name, _refuse(f"os.{name}"))
             for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv",
                          "execve", "execvp", "execvpe") if hasattr(os, name)]


@contextlib.contextmanager
def _no_launch():
    saved = [(module, name, getattr(module, name)) for module, name, _ in _REFUSED]
    for module, name, refused in _REFUSED:
        setattr(module, name, refused)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


# The C kernels (kernels/cpu_native) are found in the cache, or compiled, once per process,
# on the first model built: the lookup runs ``cc --version`` (and the compiler on a cold
# cache). That is the package's set-up, not a test's, so it happens here, before the guard.
cpu_native.library()
# platform.processor() runs ``uname -p`` once per process and caches it; h5py's import asks
# for it, so the first test module that imports h5py inside a test would launch it.
platform.processor()


# Every phase of a unit test is guarded: its set-up too, where a module- or session-scoped
# fixture it asks for first is built.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.stash[_MPI_BEFORE] = "mpi4py.MPI" in sys.modules
    with _no_launch():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_launch():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with _no_launch():
        result = yield
    if not item.stash.get(_MPI_BEFORE, True) and "mpi4py.MPI" in sys.modules:
        pytest.fail(f"{item.nodeid} loaded mpi4py.MPI (which starts MPI): an in-process MPI "
                    "test belongs in tests/mpi_inproc", pytrace=False)
    return result
