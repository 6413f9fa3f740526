"""``syncbench train --compress``: bad input is one line and exit 2 with nothing written;
a crash is resumed to the bits of an uninterrupted run (error feedback, warm-started Q);
a checkpoint is not resumed with another codec; the run file declares the bytes.

Each test launches its own small job (the synthetic dataset, a few steps per rank).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis.collectives import kind_names, read_events
from syncbench.analysis.runfile import read_run

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "512", "--batch-size", "16",
         "--progress", "never", "--algorithm", "ssgd", "--comm", "blocking"]


@pytest.mark.mpi_skip
@pytest.mark.parametrize("flags,says", [
    (["--compress", "zip"], "unknown codec 'zip'"),
    (["--compress", "powersgd:0"], "powersgd rank 0 is below 1"),
    (["--compress", "topk:0"], "topk density 0.0 is outside (0, 1]"),
    (["--compress", "randk:1.5"], "density 1.5 is outside (0, 1]"),
    (["--compress", "powersgd:2", "--comm", "overlap"], "add --comm blocking"),
    (["--compress", "fp16", "--algorithm", "odsgd"], "applies to --algorithm ssgd only"),
    (["--compress", "powersgd", "--powersgd-start", "-1"], "--powersgd-start must be >= 0"),
    (["--compress", "randk:0.01,momentum=1"], "randk momentum=1.0 is outside [0, 1)"),
    (["--compress", "topk:0.01,momentum=0.5"], "but --momentum is 0.9: give --momentum 0.5"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, flags, says):
    out = tmp_path / "bad.h5"
    proc = run_mpi(2, "train", *SMALL, *flags, "--out", str(out), timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("syncbench") and "thread" not in line]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mpi_skip
@pytest.mark.parametrize("spec,comm", [("powersgd:2", "blocking"),
                                       pytest.param("randk:0.02", "overlap",
                                                    marks=pytest.mark.slow)])
def test_resume_after_a_crash_is_exact(tmp_path, spec, comm):
    """Checkpoints carry the reducer's state: the resumed run ends with the parameters and
    losses of an uninterrupted one.

    The two reducers with the most state: PowerSGD's Q and error feedback, after its
    uncompressed start, in one blocking reduction; random-k's error feedback and
    generator, bucket by bucket under overlap. Top-k's error feedback is random-k's
    code with another selection, and the stateless codecs (fp16, bf16, int8) resume
    as SSGD does (the registry's crash test)."""
    run_flags = [*SMALL, "--comm", comm, "--bucket-mb", "0.2", "--compress", spec,
                 "--powersgd-start", "3", "--epochs", "2",
                 "--eval-every", "0.5", "--seed", "3"]
    out = tmp_path / "crash.h5"
    crash = run_mpi(2, "train", *run_flags, "--out", str(out), "--checkpoint-every", "8",
                    "--inject-fault", "1:20")
    assert crash.returncode != 0 and not out.exists()
    resumed = run_mpi(2, "train", *run_flags, "--out", str(out), "--resume",
                      "--save-model", str(tmp_path / "resumed.npy"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full = run_mpi(2, "train", *run_flags, "--out", str(tmp_path / "full.h5"),
                   "--save-model", str(tmp_path / "full.npy"))
    assert full.returncode == 0, full.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "full.npy"))
    a, b = read_run(tmp_path / "full.h5"), read_run(out)
    for rank in a.ranks:
        np.testing.assert_array_equal(a.ranks[rank]["loss"], b.ranks[rank]["loss"])
        # the codec's work is its own phase on every step (the float32 copy of the
        # gradient and its write-back, during the uncompressed start too)
        assert np.all(a.ranks[rank]["t_codec"] > 0) and np.all(b.ranks[rank]["t_codec"] > 0)


@pytest.mark.mpi_skip
@pytest.mark.slow
def test_a_checkpoint_is_not_resumed_with_another_codec(tmp_path):
    run_flags = [*SMALL, "--epochs", "2", "--seed", "3"]
    out = tmp_path / "crash.h5"
    crash = run_mpi(2, "train", *run_flags, "--compress", "fp16", "--out", str(out),
                    "--checkpoint-every", "8", "--inject-fault", "1:20")
    assert crash.returncode != 0
    resumed = run_mpi(2, "train", *run_flags, "--compress", "int8", "--out", str(out),
                      "--resume")
    assert resumed.returncode == 2
    assert "is for --compress fp16, this run is int8" in resumed.stderr, resumed.stderr
    assert not out.exists()


@pytest.mark.mpi_skip
def test_the_run_file_declares_the_compressed_bytes(tmp_path):
    """wire_bytes_per_step: fp16 half of SSGD's; the events' bytes of a step add up to it.
    The codec's time is t_codec: on every step of the compressed run, none without one."""
    declared = {}
    for spec in ("none", "fp16"):
        out = tmp_path / f"{spec}.h5"
        proc = run_mpi(2, "train", *SMALL, "--compress", spec, "--epochs", "0.25",
                       "--events", "on", "--out", str(out), timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        run = read_run(out)
        declared[spec] = int(run.attrs["wire_bytes_per_step"])
        for rows in run.ranks.values():
            assert len(rows["step"]) > 0
            assert np.all(rows["t_codec"] > 0) if spec == "fp16" else \
                np.all(rows["t_codec"] == 0)
        events = read_events(out)[0]
        sent = events.columns["bytes"][events.columns["step"] == 1]
        assert set(kind_names(events)) == (
            {"allreduce"} if spec == "none" else {"ialltoallv", "iallgather"})
        sent = int(sent.sum())
        # fp16: the Ialltoallv of the whole code vector plus the Iallgatherv of this rank's
        # segment of the mean (half of it on two ranks)
        expected = declared[spec] * (1.5 if spec == "fp16" else 1)
        assert sent == expected
    assert declared["none"] == 2 * declared["fp16"]
