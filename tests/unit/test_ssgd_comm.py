"""``syncbench ssgd-comm``: SSGD's per-step MPI time against a bare Allreduce.

* the statistics (per-block last/mean, paired ratios) re-computed by hand;
* under MPI (pytest-mpi, 2 and 4 ranks): every training variant, the bare
  ``mpi`` reference included, performs SSGD's rule, so the interleaved
  benchmark is one SSGD trajectory equal to serial large-batch SGD, with
  replicas bit-identical; the figures are complete and the JSON round-trips;
* bad flags and a missing dataset end the job with one line and exit 2.

Split off this module: ``tests/mpi_inproc/test_ssgd_comm_mpi.py`` (its in-process MPI tests)
and ``tests/e2e/test_ssgd_comm_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from syncbench.bench.commands import ssgd_comm as ssgd_comm_command
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
