"""DiLoCo ``--quantize``: quantized pseudo-gradients against serial re-computations.

Run with ``mpiexec -n 2 python -m pytest --only-mpi
tests/mpi_inproc/test_diloco_quantize_mpi.py`` (and ``-n 4``). The serial loops of
``test_diloco_slowmo_mpi`` average the ranks' pseudo-gradients (per fragment) with the
codec oracles of ``compress_oracles`` (decode and sum every rank's codes in float32 in
rank order, 1/N, encode the mean and decode it), which the reducers' hand-written
reduce-scatter and allgather reproduce bit for bit; no float MPI sum is left (no
warm-up), so the runs agree to the suite's 1e-10 bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from compress_oracles import half_mean, int8_mean
from test_diloco_slowmo_mpi import (
    _assert_identical_on_all_ranks,
    _on_rank0,
    _setup,
    _train,
    serial_outer_rounds,
    serial_streaming,
)

from syncbench.algorithms.codecs.registry import parse_codec
from syncbench.algorithms.registry import get_algorithm

CODECS = ["fp16", "bf16", "int8:64", "int4:64"]


def codec_mean(spec):
    """The oracle mean of the ranks' pseudo-gradients sent as ``spec``'s codes (float64)."""
    codec = parse_codec(spec)
    oracle = int8_mean if codec.name in ("int8", "int4") else half_mean

    def mean(deltas):
        return oracle(codec, [d.astype(np.float32) for d in deltas]).astype(np.float64)
    return mean


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spec", CODECS)
def test_quantized_diloco_equals_serial_rounds_of_codec_means(spec):
    steps, period = 10, 4
    algo, stream, data, config = _setup("diloco", steps, "--inner-steps", str(period),
                                        "--quantize", spec, "--optimizer", "adamw")
    _train(algo, stream)
    expected, buffer = _on_rank0(serial_outer_rounds, data, algo.comm.size, config,
                                 get_algorithm("diloco"), steps, period, 0, 0.7, 0.9, True,
                                 codec_mean(spec))
    np.testing.assert_allclose(algo.model.params, expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(algo.averager.outer.buffer, buffer, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)
    codec = parse_codec(spec)
    wire = algo.run_attributes["wire_bytes_per_fragment"]
    assert algo.run_attributes["wire_bytes_per_outer_step"] == sum(wire)
    n = algo.model.size
    if codec.name in ("fp16", "bf16"):
        assert wire == [2 * n]  # 16-bit codes of every parameter
    else:  # per rank segment: its codes and 8 bytes per chunk of 64
        per_code = 1 if codec.name == "int8" else 0.5
        assert per_code * n + 8 * n / 64 <= wire[0] <= per_code * n + 8 * (n / 64 + 8) + 8


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spec", CODECS)
def test_quantized_streaming_diloco_equals_serial_fragments(spec):
    steps, period, fragments, tau, alpha = 17, 6, 3, 1, 0.5
    algo, stream, data, config = _setup(
        "diloco", steps, "--inner-steps", str(period), "--fragments", str(fragments),
        "--overlap-steps", str(tau), "--mix", str(alpha), "--quantize", spec,
        "--optimizer", "adamw")
    _train(algo, stream)
    expected, buffers = _on_rank0(serial_streaming, data, algo.comm.size, config,
                                  get_algorithm("diloco"), steps, period, fragments, tau,
                                  alpha, 0, codec_mean(spec))
    np.testing.assert_allclose(algo.model.params, expected, rtol=0, atol=1e-10)
    for outer, buffer in zip(algo.averager.outers, buffers):
        np.testing.assert_allclose(outer.buffer, buffer, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)
    bounds = algo.averager.bounds
    wire = algo.run_attributes["wire_bytes_per_fragment"]
    assert len(wire) == fragments and algo.run_attributes["wire_bytes_per_outer_step"] == sum(wire)
    if spec in ("fp16", "bf16"):
        assert wire == [2 * (hi - lo) for lo, hi in bounds]


@pytest.mark.mpi(min_size=2)
def test_unquantized_diloco_records_its_float_bytes():
    algo, _, _, _ = _setup("diloco", 4, "--inner-steps", "2", "--fragments", "2")
    bounds = algo.averager.bounds
    assert algo.run_attributes["wire_bytes_per_fragment"] == [8 * (hi - lo) for lo, hi in bounds]
    assert algo.run_attributes["wire_bytes_per_outer_step"] == 8 * algo.model.size


@pytest.mark.mpi(min_size=2)
def test_a_quantized_pseudo_gradient_is_charged_to_codec():
    """--quantize's encode, decode and sum of codes are the codec phase, not update."""
    algo, _, _, _ = _setup("diloco", 4, "--inner-steps", "2", "--quantize", "int8:64",
                           "--optimizer", "adamw")
    quantized = algo.averager.quantized
    algo.timer.reset()
    quantized.post(0, algo.model.params * 0 + 1)
    quantized.wait(0)
    assert algo.timer.totals["codec"] > 0 and algo.timer.totals["update"] == 0.0
