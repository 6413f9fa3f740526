"""ASGD through MPI RMA windows: atomic pushes, serial equivalence, DC-ASGD, end to end: the
tests that launch nothing and load no MPI.

Split off e2e/test_asgd_mpi_e2e.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import pytest
from helpers import train_config

from syncbench.algorithms.not_lock_step import data_shard
from syncbench.algorithms.registry import get_algorithm, validate


def test_validate_rejects_bad_flags():
    cls = get_algorithm("asgd")
    with pytest.raises(ValueError, match="--delay-compensation"):
        validate(cls, train_config("--algorithm", "asgd", "--delay-compensation", "-1"), 2)
    with pytest.raises(ValueError, match="dedicated"):
        validate(cls, train_config("--algorithm", "asgd", "--ps-layout", "dedicated"), 1)
    with pytest.raises(ValueError, match="--worker-momentum"):
        validate(cls, train_config("--algorithm", "asgd", "--worker-momentum", "1"), 2)
    config = train_config("--algorithm", "asgd")
    assert config.ps_layout == "sharded" and config.delay_compensation == 0.0
    assert config.rma_assert == "nocheck"
    assert config.async_lr_scale == "none" and config.worker_momentum == 0.5
    validate(cls, train_config("--algorithm", "asgd", "--checkpoint-every", "5"), 2)


def test_worker_learning_rate_matches_the_effective_step_of_ssgd():
    from syncbench.algorithms.asgd import worker_learning_rate

    # equal momenta: the usual lr / W
    assert worker_learning_rate(0.05, 0.9, 0.9, 4, "workers") == pytest.approx(0.0125)
    # lower worker momentum: W pushes of lr_w / (1 - mu_w) make one lr / (1 - mu)
    lr_w = worker_learning_rate(0.05, 0.9, 0.5, 4, "workers")
    assert 4 * lr_w / (1 - 0.5) == pytest.approx(0.05 / (1 - 0.9))
    assert worker_learning_rate(0.05, 0.9, 0.5, 4, "none") == 0.05


def test_dedicated_layout_shards_the_data_over_the_workers():
    cls = get_algorithm("asgd")
    dedicated = train_config("--algorithm", "asgd", "--ps-layout", "dedicated")
    assert [data_shard(cls, dedicated, r, 4) for r in range(1, 4)] == [(0, 3), (1, 3), (2, 3)]
    sharded = train_config("--algorithm", "asgd")
    assert [data_shard(cls, sharded, r, 4) for r in range(4)] == [(r, 4) for r in range(4)]
