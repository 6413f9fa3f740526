"""Fingerprints of fixed-seed training runs: every strategy, every option that changes its
arithmetic, so that two commits can be shown to train bit-identically.

Usage: python jobs/strategy_identity.py OUT_DIR [> fingerprints.txt]
       python jobs/strategy_identity.py --digest OUT_DIR   (fingerprints of earlier runs)

Each case is one ``mpiexec -n N syncbench train`` on the synthetic dataset with a fixed
seed and ``--save-model``. A case prints one line: its name, the SHA-256 of the saved
model's arrays (parameters and running statistics, in file order) and the SHA-256 of the
run file's fields that do not measure time (every evaluation's loss, accuracy, samples and
step; every rank's per-step loss, samples, staleness, local steps, round and step; the
strategy's root attributes). Run it at two commits and ``diff`` the outputs: equal lines
are equal parameters and equal run files, timing fields aside.

A case that is not deterministic by design is run at a size where it is: ASGD with one
worker (``single`` and ``sharded`` at one rank, ``dedicated`` at two: one worker and one
server); Oscars without ``--adaptive`` and with ``--averaging uniform`` (its adaptive
period and weights follow measured speeds). AD-PSGD has no such size (it needs two ranks
or more, whose reads and averages interleave as their timing falls): its arithmetic is
checked against a serial re-computation in a forced order instead
(``tests/mpi_inproc/test_adpsgd_mpi.py``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

BIN = Path(sys.executable).parent
BASE = ["--dataset", "synthetic", "--synthetic-samples", "1536", "--epochs", "1",
        "--batch-size", "32", "--eval-every", "0.5", "--seed", "11", "--progress", "never"]
#: OD-SGD's warm-up (SSGD steps) short enough that its local optimizers run.
ODSGD_SHORT = ["--warmup-steps", "2", "--eval-model", "both"]
OSCARS_FIXED = ["--no-adaptive", "--averaging", "uniform"]

#: (name, ranks, flags).
CASES: list[tuple[str, int, list[str]]] = [
    ("ssgd-overlap", 2, ["--algorithm", "ssgd"]),
    ("ssgd-overlap-4", 4, ["--algorithm", "ssgd", "--bucket-mb", "0.01"]),
    ("ssgd-blocking", 2, ["--algorithm", "ssgd", "--comm", "blocking"]),
    ("ssgd-lenet-wd-exempt", 2, ["--algorithm", "ssgd", "--model", "lenet", "--wd-exempt",
                                 "--weight-decay", "1e-3"]),
    ("ssgd-resnet8-sync-bn", 2, ["--algorithm", "ssgd", "--model", "resnet8", "--sync-bn",
                                 "--synthetic-samples", "256"]),
    ("localsgd-keep", 2, ["--algorithm", "localsgd", "--period", "3"]),
    ("localsgd-zero", 2, ["--algorithm", "localsgd", "--period", "3", "--momentum-sync",
                          "zero"]),
    ("localsgd-average-4", 4, ["--algorithm", "localsgd", "--period", "5", "--momentum-sync",
                               "average"]),
    ("localsgd-resnet8", 2, ["--algorithm", "localsgd", "--model", "resnet8",
                             "--synthetic-samples", "256"]),
    ("oscars-fixed", 2, ["--algorithm", "oscars", *OSCARS_FIXED]),
    ("oscars-fixed-overlap", 2, ["--algorithm", "oscars", "--overlap", *OSCARS_FIXED]),
    ("oscars-fixed-growth-4", 4, ["--algorithm", "oscars", "--period-growth", "2",
                                  "--max-period", "16", "--global-lr", "0.8", *OSCARS_FIXED]),
    ("odsgd-sgd", 2, ["--algorithm", "odsgd", *ODSGD_SHORT]),
    ("odsgd-dc", 2, ["--algorithm", "odsgd", "--local-opt", "dc", *ODSGD_SHORT]),
    ("odsgd-cadc", 2, ["--algorithm", "odsgd", "--local-opt", "cadc", *ODSGD_SHORT]),
    ("odsgd-lookahead-4", 4, ["--algorithm", "odsgd", "--local-lookahead", *ODSGD_SHORT]),
    ("odsgd-warmup-default", 2, ["--algorithm", "odsgd"]),
    ("asgd-single-1", 1, ["--algorithm", "asgd", "--ps-layout", "single"]),
    ("asgd-sharded-1", 1, ["--algorithm", "asgd", "--ps-layout", "sharded"]),
    ("asgd-dedicated-2", 2, ["--algorithm", "asgd", "--ps-layout", "dedicated"]),
    ("asgd-dedicated-dc-2", 2, ["--algorithm", "asgd", "--ps-layout", "dedicated",
                                "--delay-compensation", "0.04"]),
]

EVAL_FIELDS = ("accuracy", "loss", "samples_seen", "step")
RANK_FIELDS = ("loss", "samples", "staleness", "staleness_min", "local_steps", "round", "step",
               "rows")
#: Root attributes compared (not ``strategy_flags``: the names of the options a strategy
#: takes, which grow when it gains one; the values of its options are in ``config``).
ROOT_ATTRS = ("algorithm", "buckets", "warmup_steps", "world_size", "model", "complete")


def digest_model(path: Path) -> str:
    """SHA-256 of the saved consensus parameters (``--save-model``'s ``.npy``)."""
    return hashlib.sha256(np.ascontiguousarray(np.load(path)).tobytes()).hexdigest()[:16]


def digest_run(path: Path) -> str:
    """SHA-256 over the run file's fields that do not measure time."""
    digest = hashlib.sha256()
    with h5py.File(path, "r") as run:
        for name in EVAL_FIELDS:
            digest.update(np.asarray(run["eval"][name]).tobytes())
        for name in RANK_FIELDS:
            if name in run["ranks"]:
                digest.update(np.asarray(run["ranks"][name]).tobytes())
        for name in ROOT_ATTRS:
            digest.update(repr(run.attrs.get(name)).encode())
    return digest.hexdigest()[:16]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--digest":  # the runs of an earlier call
        for name, _, _ in CASES:
            run, model = Path(sys.argv[2]) / f"{name}.h5", Path(sys.argv[2]) / f"{name}.npy"
            print(f"{name:24s} model {digest_model(model)}  run {digest_run(run)}")
        return 0
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    failed = 0
    for name, ranks, flags in CASES:
        run, model = out / f"{name}.h5", out / f"{name}.npy"
        run.unlink(missing_ok=True)
        model.unlink(missing_ok=True)
        cmd = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "syncbench"), "train",
               *BASE, *flags, "--out", str(run), "--save-model", str(model)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out)
        if proc.returncode != 0:
            failed += 1
            print(f"{name:24s} FAILED: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{name:24s} model {digest_model(model)}  run {digest_run(run)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
