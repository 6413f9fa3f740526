"""``syncbench env``: the MPI library it names is the one loaded; a missing piece is one line.

The library's path is checked against ``/proc/self/maps`` of another process that
loaded ``mpi4py.MPI`` (so the test does not read the command's own answer back).
Pieces are hidden for real: ``MPI4PY_LIBMPI`` pointing at no library leaves mpi4py
nothing to load, and a package on ``PYTHONPATH`` that fails to import stands for a
broken h5py. A 2-rank run then carries the same facts in its run file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import run_mpi

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run

MAPS_OF_MPI = ("from mpi4py import MPI\n"
               "for line in open('/proc/self/maps'):\n"
               "    path = line.split()[-1]\n"
               "    if path.rsplit('/', 1)[-1].startswith('libmpi'):\n"
               "        print(path); break\n")


@pytest.fixture(scope="module")
def libmpi() -> str:
    """The libmpi path a process that imported mpi4py.MPI has mapped."""
    proc = subprocess.run([sys.executable, "-c", MAPS_OF_MPI], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    return proc.stdout.strip()


def env_command(**extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench", "env"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **extra})


def fact_line(out: str, name: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, out
    return lines[0]


def test_env_names_the_library_proc_maps_shows_and_succeeds(libmpi):
    proc = env_command()
    assert proc.returncode == 0, proc.stderr
    assert fact_line(proc.stdout, "MPI library").split()[2] == libmpi
    for name in ("MPI version", "MPI vendor", "mpi4py", "CUDA-aware MPI", "GPU",
                 "dataset synthetic", "SimGrid", "Slurm", "emulated cluster", "PyTorch",
                 "train threads", "numpy", "h5py"):
        fact_line(proc.stdout, name)
    assert proc.stderr == ""


def test_no_mpi_library_is_one_line_and_a_non_zero_exit(tmp_path):
    proc = env_command(MPI4PY_LIBMPI=str(tmp_path / "libmpi.so.12"))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench env: missing: no MPI library "
                                                   "loads"), proc.stderr
    assert "pip install -e '.[mpich]'" in lines[0] and "Traceback" not in proc.stderr
    assert fact_line(proc.stdout, "MPI library").split()[2:4] == ["none", "loads"]


def test_train_without_an_mpi_library_is_one_line_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "syncbench", "train", "--algorithm", "ssgd",
                           "--model", "mlp", "--dataset", "synthetic", "--epochs", "0.1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MPI4PY_LIBMPI": str(tmp_path / "libmpi.so.12")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench train: error: cannot load what "
                                                   "it needs: cannot load MPI library"), lines
    assert "syncbench env" in lines[0]


def test_every_missing_piece_has_its_own_line(tmp_path):
    broken = tmp_path / "h5py"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('h5py hidden by the test')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    proc = env_command(MPI4PY_LIBMPI=str(tmp_path / "libmpi.so.12"), PYTHONPATH=path)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("syncbench env: missing: h5py does not import (h5py hidden")
    assert lines[1].startswith("syncbench env: missing: no MPI library loads")


def test_datasets_are_looked_up_as_train_does_and_a_missing_one_is_not_missing(tmp_path):
    (tmp_path / "mnist").mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / "mnist" / name).write_bytes(b"")
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "data_batch_1.bin").write_bytes(b"")  # incomplete
    proc = env_command(SYNCBENCH_DATA=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert fact_line(proc.stdout, "dataset mnist").split()[2] == str(tmp_path / "mnist")
    cifar = fact_line(proc.stdout, "dataset cifar10")
    assert cifar.split()[2:4] == ["not", "found"] and "incomplete" in cifar
    assert fact_line(proc.stdout, "dataset synthetic").split()[2] == "generated"


def test_the_run_file_carries_the_same_facts(tmp_path, libmpi):
    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", "--dataset", "synthetic", "--synthetic-samples", "512",
                   "--batch-size", "32", "--epochs", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(read_run(out).attrs[schema.ENVIRONMENT_ATTR])
    assert facts["MPI library"]["value"] == libmpi
    assert facts["GPU"]["value"] == "cpu" and facts["dataset"]["value"] == "generated"
    assert facts["CUDA-aware MPI"]["value"] in ("yes", "no") and facts["CUDA-aware MPI"]["how"]
    assert {"MPI version", "MPI vendor", "mpi4py", "SimGrid", "Slurm", "emulated cluster",
            "PyTorch", "train threads"} <= set(facts)
