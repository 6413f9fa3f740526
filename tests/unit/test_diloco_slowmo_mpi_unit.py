"""DiLoCo and SlowMo against serial re-computations of every rank in one process.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_diloco_slowmo_mpi.py``
(and ``-n 4``); the option checks also run in a plain serial pytest. float64
throughout: the MPI job and the serial loop differ only in the order MPI sums, so they
agree to 1e-10 (the bound of every re-computation in this suite).

Split off ``tests/mpi_inproc/test_diloco_slowmo_mpi.py``: the tests that compute in the
test's process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest
from helpers import train_args

from syncbench.bench.train.config import build_train_config


# -- serial ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--algorithm", "diloco", "--inner-steps", "0"], "--inner-steps must be >= 1, got 0"),
        (["--algorithm", "diloco", "--outer-lr", "0"], "--outer-lr must be > 0, got 0.0"),
        (["--algorithm", "diloco", "--outer-momentum", "1"],
         "--outer-momentum must be in [0, 1), got 1.0"),
        (["--algorithm", "diloco", "--sync-warmup", "-1"], "--sync-warmup must be >= 0, got -1"),
        (["--algorithm", "diloco", "--inner-steps", "6", "--fragments", "7"],
         "--fragments 7 must be <= --inner-steps 6"),
        (["--algorithm", "diloco", "--inner-steps", "6", "--fragments", "2", "--overlap-steps",
          "3"], "--overlap-steps must be in [0, --inner-steps // --fragments = 3), got 3"),
        (["--algorithm", "diloco", "--mix", "-0.1"], "--mix must be in [0, 1], got -0.1"),
        (["--algorithm", "diloco", "--mix", "1.5"], "--mix must be in [0, 1], got 1.5"),
        (["--algorithm", "slowmo", "--period", "0"], "--period must be >= 1, got 0"),
        (["--algorithm", "slowmo", "--slow-lr", "-1"], "--slow-lr must be > 0, got -1.0"),
        (["--algorithm", "slowmo", "--slow-momentum", "1.5"],
         "--slow-momentum must be in [0, 1), got 1.5"),
    ],
)
def test_bad_options_are_one_line(flags, message):
    with pytest.raises(ValueError) as err:  # where the run's configuration is built
        build_train_config(train_args(*flags), 2)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--quantize", "topk:0.1"], "--quantize topk:0.1: a pseudo-gradient travels in "
         "fp16, bf16, int8, int4 (int8 and int4 take :CHUNK) or none"),
        (["--quantize", "powersgd:2"], "--quantize powersgd:2: a pseudo-gradient travels in "),
        (["--quantize", "nope"], "--quantize: unknown codec 'nope' in 'nope': choose one of "),
        (["--quantize", "int8:0"], "--quantize: int8 chunk 0 is below 1"),
        (["--quantize", "fp16:2"], "--quantize: fp16 takes no argument, got 'fp16:2'"),
    ],
)
def test_a_bad_quantize_codec_is_one_line(flags, message):
    with pytest.raises(ValueError) as err:
        build_train_config(train_args("--algorithm", "diloco", *flags), 2)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)



def test_quantize_is_diloco_s():
    with pytest.raises(ValueError, match="--quantize int8 applies to --algorithm diloco"):
        build_train_config(train_args("--algorithm", "localsgd", "--quantize", "int8"), 2)
