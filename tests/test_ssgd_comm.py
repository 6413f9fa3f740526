"""``syncbench ssgd-comm``: SSGD's per-step MPI time against a bare Allreduce.

* the statistics (per-block last/mean, paired ratios) re-computed by hand;
* under MPI (pytest-mpi, 2 and 4 ranks): every training variant, the bare
  ``mpi`` reference included, performs SSGD's rule, so the interleaved
  benchmark is one SSGD trajectory equal to serial large-batch SGD, with
  replicas bit-identical; the figures are complete and the JSON round-trips;
* bad flags and a missing dataset end the job with one line and exit 2.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from helpers import run_mpi
from test_ssgd_mpi import serial_large_batch

from syncbench.bench.commands import ssgd_comm as ssgd_comm_command
from syncbench.bench.data.catalog import load_dataset
from syncbench.bench.micro import ssgd_comm
from syncbench.bench.mpi.errors import CommandParser


def _parser() -> argparse.ArgumentParser:
    """``syncbench ssgd-comm``'s parser (one error line, exit status 2)."""
    parser = CommandParser(prog="syncbench ssgd-comm")
    ssgd_comm_command.add_arguments(parser)
    return parser


def test_block_figures_and_paired_ratio_by_hand():
    # seconds[rank, block, step]: 2 ranks, 2 blocks, 3 steps
    t = np.array([[[1, 4, 3], [2, 2, 2]],
                  [[2, 1, 5], [4, 1, 3]]], dtype=float) * 1e-3
    last, mean = ssgd_comm.block_figures(t)
    np.testing.assert_allclose(last, [(1 + 1 + 3) / 3, (2 + 1 + 2) / 3])
    np.testing.assert_allclose(mean, [16 / 6, 14 / 6])
    assert ssgd_comm.paired_ratio(np.array([2.0, 9.0, 3.0]), np.array([1.0, 3.0, 1.0])) == 3.0


def test_summarize_pairs_rounds_and_keeps_every_block():
    ref = np.full((2, 3, 4), 1e-3)
    ref[:, 1] = 2e-3  # a slow round: the paired ratio ignores it
    gathered = {"mpi": ref, "blocking": ref * 1.1, "tight": ref * 0.5}
    s = ssgd_comm.summarize(gathered)
    assert s["mpi"]["last_over_mpi"] == 1.0
    assert s["blocking"]["last_over_mpi"] == pytest.approx(1.1)
    assert s["blocking"]["last_over_tight"] == pytest.approx(2.2)
    assert s["tight"]["mean_over_mpi"] == pytest.approx(0.5)
    assert s["mpi"]["blocks_last_ms"] == pytest.approx([1.0, 2.0, 1.0])
    assert s["mpi"]["last_ms"] == pytest.approx(1.0)
    assert (s["mpi"]["last_min_ms"], s["mpi"]["last_max_ms"]) == pytest.approx((1.0, 2.0))


@pytest.mark.parametrize("variants", ["blocking,overlap", "mpi,mpi", "mpi,allgather"])
def test_variants_must_be_known_distinct_and_include_the_reference(variants, capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--variants", variants])
    assert exc.value.code == 2
    assert "--variants" in capsys.readouterr().err


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


def test_missing_dataset_ends_the_job_with_one_line(tmp_path):
    proc = run_mpi(2, "ssgd-comm", "--dataset", "cifar10", "--data-dir", str(tmp_path),
                   "--blocks", "1", timeout=60, env={"SYNCBENCH_DATA": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("syncbench")]
    assert len(errors) == 1 and "cifar10" in errors[0], proc.stderr
    assert errors[0].startswith("syncbench ssgd-comm: error: ")
    assert errors[0].endswith(" (see 'syncbench ssgd-comm --help')")
