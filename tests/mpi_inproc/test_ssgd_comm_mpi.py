"""``syncbench ssgd-comm``: SSGD's per-step MPI time against a bare Allreduce: the tests that
run in process on every rank (pytest-mpi).

Split off unit/test_ssgd_comm.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from oracles import serial_large_batch
from test_ssgd_comm import _parser

from syncbench.bench.data.catalog import load_dataset
from syncbench.bench.micro import ssgd_comm


def _args(*flags: str) -> argparse.Namespace:
    return _parser().parse_args([
        "--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", "512",
        "--batch-size", "8", "--dtype", "float64", "--seed", "3", "--bucket-mb", "0.05",
        *flags])


@pytest.mark.mpi(min_size=2)
def test_interleaved_variants_are_one_ssgd_trajectory():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size = world.Get_size()
    args = _args()
    bench = ssgd_comm.build_bench(args, world)
    times = ssgd_comm.measure(bench, list(ssgd_comm.VARIANTS),
                              blocks=2, block_steps=3, untimed_steps=1)
    assert all(t.shape == (2, 3) and np.all(t > 0) for t in times.values())
    steps = bench.stream.position  # batches taken: every training step, no others
    assert steps == 3 * ((1 + 1) + 2 * (3 + 1))
    assert len(bench.compute_s) == steps // 3  # the reference's compute times feed spin

    data = load_dataset("synthetic", synthetic_train=512, seed=3)
    config = argparse.Namespace(lr=args.lr, momentum=args.momentum, weight_decay=0.0,
                                wd_exempt=False)
    expected = serial_large_batch("mlp", data, size, 8, 3, config, steps)
    np.testing.assert_allclose(bench.model.params, expected, rtol=0, atol=1e-10)
    for other in world.allgather(bench.model.params):
        assert np.array_equal(other, bench.model.params)


@pytest.mark.mpi(min_size=2)
def test_run_prints_and_writes_every_variant(tmp_path, capsys):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    path = world.bcast(str(tmp_path / "comm.json"), root=0)
    args = _args("--blocks", "3", "--block-steps", "2", "--untimed-steps", "0",
                 "--json", path)
    result = ssgd_comm.run(args, world)
    if world.Get_rank() != 0:
        assert result is None
        return
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("  ")]
    assert [r[0] for r in rows] == list(ssgd_comm.VARIANTS)
    assert all(len(r) == 8 for r in rows)
    saved = json.loads(open(path).read())
    assert saved["world_size"] == world.Get_size()
    assert saved["nbytes"] == 8 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
    for name, row in zip(ssgd_comm.VARIANTS, rows):
        v = saved["variants"][name]
        assert len(v["blocks_last_ms"]) == 3
        assert 0 < v["last_ms"] and v["last_ms"] <= v["mean_ms"] + 1e-12
        assert float(row[1]) == pytest.approx(v["last_ms"], abs=1e-4)
        assert float(row[5]) == pytest.approx(v["last_over_mpi"], abs=1e-3)
    assert saved["variants"]["mpi"]["last_over_mpi"] == 1.0
