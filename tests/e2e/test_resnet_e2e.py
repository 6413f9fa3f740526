"""The BatchNorm networks: resnet8/resnet20 layers against finite differences and direct
formulas, their running statistics, weight-decay exemptions, and train's flags for them.

Split off ``tests/unit/test_resnet.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.algorithms.base import Budget
from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.kernels.zoo import build_model

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "256", "--batch-size", "16"]


def test_checkpoint_state_carries_the_running_statistics():
    from helpers import train_config
    from mpi4py import MPI

    from syncbench.algorithms.communicator import Communicator
    from syncbench.algorithms.registry import get_algorithm

    def algorithm():
        model = build_model("resnet8", (1, 28, 28), 10, dtype=np.float64)
        return get_algorithm("ssgd")(model, Communicator(MPI.COMM_SELF), train_config(),
                                     Budget(64, 8, 1))

    first = algorithm()
    first.model.buffers[...] = np.arange(first.model.buffers.size)
    second = algorithm()
    second.load_state(first.state())
    np.testing.assert_array_equal(second.model.buffers, first.model.buffers)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--model", "mlp", "--sync-bn"], "--sync-bn: model mlp has no BatchNorm layer"),
        (["--model", "resnet8", "--sync-bn", "--algorithm", "asgd"], "asgd cannot --sync-bn"),
        (["--model", "resnet8", "--sync-bn", "--algorithm", "oscars"],
         "oscars cannot --sync-bn"),
        (["--model", "resnet8", "--algorithm", "asgd", "--ps-layout", "dedicated"],
         "asgd --ps-layout dedicated cannot train resnet8"),
    ],
)
def test_batchnorm_flags_fail_in_one_line(flags, needle):
    started = time.monotonic()
    proc = run_mpi(2, "train", *SMALL, *flags, timeout=60)
    assert proc.returncode != 0 and time.monotonic() - started < 30
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncbench train: error: ")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_local_evaluation_of_synchronised_ssgd_equals_the_global_one(tmp_path):
    """SSGD with --sync-bn: every rank holds the consensus weights and the same running
    statistics, so scoring each on its test shard and pooling gives exactly the global
    accuracy; the run file keeps both (/eval and /eval_local, final_local_accuracy)."""
    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", *SMALL, "--model", "resnet8", "--sync-bn", "--epochs", "1",
                   "--eval-every", "0", "--eval-model", "both", "--out", str(out),
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    import h5py

    with h5py.File(out) as f:
        local = f[schema.EVAL_LOCAL_GROUP]["accuracy"][:]
        local_loss = f[schema.EVAL_LOCAL_GROUP]["loss"][:]
    assert len(local) == len(run.eval["accuracy"]) == 1
    np.testing.assert_allclose(local, run.eval["accuracy"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(local_loss, run.eval["loss"], rtol=1e-5)
    assert run.summary_extra[schema.FINAL_LOCAL_ACCURACY] == pytest.approx(local[-1])
