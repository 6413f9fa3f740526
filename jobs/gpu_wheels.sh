#!/usr/bin/env bash
# The wheels jobs/gpu_check.sh may need on the GPU machine, which reaches no package index:
# the MPICH wheel (an MPI library and mpiexec, for an mpi4py that loads none) and pytest-mpi
# (the 2-rank tests' --with-mpi), for CPython 3.12 on manylinux x86-64, into <repo>/.whl
# (ignored by git; the device machine's launcher carries it when its carry list names
# ".whl"). Run it on a machine with network; it prints what it saved and the total size,
# which must stay under 64 MiB with the working tree.
#
# Usage:  bash jobs/gpu_wheels.sh [DEST]     (DEST default <repo>/.whl)
# Variables: PYTHON (default python3), PY_VERSION (default 3.12), MPICH (default 5.0.2),
#            PYTEST_MPI (default 0.6)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.whl}
PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
mkdir -p "$DEST"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" \
    "mpich==${MPICH:-5.0.2}" "pytest-mpi==${PYTEST_MPI:-0.6}"
ls -l "$DEST"
du -sh "$DEST"
