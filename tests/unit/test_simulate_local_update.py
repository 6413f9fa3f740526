"""The local optimizer's step in a simulated update (``bench/simulate/local_update.py``):
a workload measured with momentum SGD replayed for a strategy that steps with AdamW has
its update, and only its update, scaled by the two steps' times on this host."""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import local_update
from syncbench.bench.simulate.workload import Workload, run_optimizer


def config(*flags: str):
    return build_parser("simulate").parse_args(["simulate", *flags])


def workload(optimizer: str | None) -> Workload:
    rows = np.array([[1e-4, 1e-3, 2e-4], [1e-4, 1.1e-3, 2.2e-4]])
    extra = {} if optimizer is None else {"optimizer": optimizer}
    return Workload(name="mlp", params=50_000, batch_size=64, dataset_samples=60_000,
                    rows=rows, rank_bounds=[0, 2], mean_update_s=2e-4, extra=extra)


def test_a_run_records_the_optimizer_it_stepped_with():
    assert run_optimizer("localsgd", None) == "sgd"
    assert run_optimizer("diloco", None) == "adamw"
    assert run_optimizer("diloco", "sgd") == "sgd"
    assert run_optimizer("no-such-strategy", None) is None


def test_adamw_where_the_workload_stepped_sgd_scales_the_update_only():
    w = workload("sgd")
    got = local_update.matched(config("--algorithm", "diloco"), w)
    factor = got.extra["update_factor"]
    # AdamW reads and writes more per element than momentum SGD: a dearer step
    assert factor > 1.0
    assert factor == local_update.step_ratio("adamw", "sgd", w.params)
    np.testing.assert_allclose(got.rows[:, 2], w.rows[:, 2] * factor)
    np.testing.assert_array_equal(got.rows[:, :2], w.rows[:, :2])
    assert got.mean_update_s == pytest.approx(w.mean_update_s * factor)
    # and back: an SGD run predicted from an AdamW workload is cheaper
    back = local_update.matched(config("--algorithm", "localsgd"), workload("adamw"))
    assert back.extra["update_factor"] == pytest.approx(1.0 / factor, rel=0.5)


@pytest.mark.parametrize("flags,measured", [(("--algorithm", "localsgd"), "sgd"),
                                            (("--algorithm", "diloco"), "adamw"),
                                            (("--algorithm", "diloco", "--optimizer", "sgd"),
                                             "sgd"),
                                            (("--algorithm", "diloco"), None)])
def test_the_same_optimizer_or_a_profile_leaves_the_workload_alone(flags, measured):
    w = workload(measured)
    assert local_update.matched(config(*flags), w) is w
