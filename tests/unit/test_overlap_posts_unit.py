"""When reductions are posted and waited on: SSGD buckets and OD-SGD's one-step delay: the tests
that launch nothing and load no MPI.

Split off mpi_inproc/test_overlap_posts.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config

from syncbench.algorithms.reducers.buckets import bucket_bytes, plan_buckets
from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.kernels.zoo import build_model


# -- bucket planning (serial) -----------------------------------------------------
def test_plan_closes_a_bucket_before_a_layer_would_overflow_it():
    # layers (reverse order): 5, 40, 800 elements, then a layer without parameters
    offsets = [0, 0, 800, 840]  # Flatten (empty), L1 [0,800), L2 [800,840), L3 [840,845)
    assert plan_buckets(offsets, 845, 100) == [(800, 845), (0, 800)]
    # the old rule (close once the pending gradient reaches the size) gave one bucket
    # here; closing before the overflow gives the big first layer its own
    assert plan_buckets(offsets, 845, 45) == [(800, 845), (0, 800)]
    assert plan_buckets(offsets, 845, 44) == [(840, 845), (800, 840), (0, 800)]
    assert plan_buckets(offsets, 845, 10_000) == [(0, 845)]
    assert plan_buckets(offsets, 845, 1) == [(840, 845), (800, 840), (0, 800)]


@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_auto_bucket_size_gives_mlp_and_lenet_several_buckets(model_name, dtype):
    model = build_model(model_name, (1, 28, 28), 10, dtype=dtype)
    elems = bucket_bytes("auto", model.grads.nbytes) // model.grads.itemsize
    plan = plan_buckets(model.layer_offsets, model.size, elems)
    assert len(plan) >= 2
    # the buckets tile the gradient, in the order backward completes them
    assert plan[0][1] == model.size and plan[-1][0] == 0
    assert all(a[0] == b[1] for a, b in zip(plan, plan[1:]))


def test_bucket_mb_flag_accepts_auto_and_numbers():
    assert train_config().bucket_mb == "auto"
    assert train_config("--bucket-mb", "0.5").bucket_mb == 0.5
    with pytest.raises(ValueError, match="--bucket-mb must be auto or > 0"):
        validate(get_algorithm("ssgd"), train_config("--bucket-mb", "0"), 2)
