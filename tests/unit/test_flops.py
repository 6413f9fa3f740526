"""FLOP counts per training step (kernels/flops.py) against hand counts, and the FLOP,
GEMM and peak columns of ``syncbench speed``.

Split off this module: ``tests/e2e/test_flops_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import pytest

from syncbench.bench.micro.speed import PeakEstimate, model_step_flops, peak_estimate
from syncbench.kernels.flops import first_trained, layer_flops, param_count, step_flops
from syncbench.kernels.zoo import build_model, model_layers

BATCH = 64


def conv(cin, cout, k, oh, ow):
    """Forward FLOPs of one sample through a k x k convolution to an oh x ow plane."""
    return 2 * cout * cin * k * k * oh * ow


def linear(fan_in, fan_out):
    return 2 * fan_in * fan_out


def test_mlp_flops_at_batch_64_equal_the_hand_count():
    fwd = [linear(784, 256), linear(256, 128), linear(128, 10)]
    params = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    step = model_step_flops("mlp", BATCH)
    assert step.forward == BATCH * sum(fwd) == 30_048_256
    # weight gradients: as much again; input gradients: all but the first Linear's
    assert step.backward == BATCH * (sum(fwd) + sum(fwd[1:])) == 34_406_400
    assert step.params == params == build_model("mlp", (1, 28, 28), 10).size
    assert step.update == 4 * params
    assert step.total == step.forward + step.backward + 4 * params == 65_395_240


def test_lenet_flops_at_batch_64_equal_the_hand_count():
    # conv5 1->6 pad 2 at 28x28 (28x28 out), pool, conv5 6->16 (14 -> 10), pool, 400-120-84-10
    fwd = [conv(1, 6, 5, 28, 28), conv(6, 16, 5, 10, 10),
           linear(400, 120), linear(120, 84), linear(84, 10)]
    assert fwd == [235_200, 480_000, 96_000, 20_160, 1_680]
    step = model_step_flops("lenet", BATCH)
    assert [e.forward for e in step.layers] == [BATCH * f for f in fwd]
    assert [e.weight_grad for e in step.layers] == [BATCH * f for f in fwd]
    assert [e.input_grad for e in step.layers] == [0] + [BATCH * f for f in fwd[1:]]
    assert step.forward == 53_314_560
    assert step.backward == 91_576_320
    # forward + backward: 144.9 MFLOP; with the first conv's input gradient it would be
    # 3 x forward = 159.9 MFLOP
    assert step.forward + step.backward == 144_890_880 == 3 * step.forward - BATCH * fwd[0]
    assert step.forward + step.backward == pytest.approx(160e6, rel=0.1)
    params = (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + 850
    assert step.params == params == 61_706
    assert step.total == 144_890_880 + 4 * 61_706


@pytest.mark.parametrize("name, blocks", [("resnet8", 1), ("resnet20", 3)])
def test_resnet_flops_count_strided_convs_and_no_shortcut(name, blocks):
    fwd = [conv(1, 16, 3, 28, 28)]
    for width, side, first_in in ((16, 28, 16), (32, 14, 16), (64, 7, 32)):
        for block in range(blocks):
            cin = first_in if block == 0 else width  # stride 2 into stages 2 and 3
            fwd += [conv(cin, width, 3, side, side), conv(width, width, 3, side, side)]
    fwd.append(linear(64, 10))
    step = model_step_flops(name, BATCH)
    assert [e.forward for e in step.layers] == [BATCH * f for f in fwd]
    assert step.forward == BATCH * sum(fwd)
    assert step.backward == BATCH * (2 * sum(fwd) - fwd[0])
    assert step.params == build_model(name, (1, 28, 28), 10).size
    assert step.update == 4 * step.params
    assert "stride=2" in step.layers[2 * blocks + 1].name and ".conv1" in step.layers[3].name


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet8", "resnet20", "mlp:64"])
def test_the_skipped_input_gradient_is_the_models_first_trained_layer(name):
    model = build_model(name, (1, 28, 28), 10)
    layers = model_layers(name, (1, 28, 28), 10)
    assert first_trained(layers) == model.first_trained
    assert param_count(layers) == model.size
    entries = layer_flops(layers, (1, 28, 28), 2)
    assert [e.input_grad == 0 for e in entries] == [i == 0 for i in range(len(entries))]
    assert entries[0].layer == model.first_trained
    assert not model.layers[model.first_trained].needs_input_grad


def test_weight_decay_adds_two_flop_per_parameter_and_counts_scale_with_the_batch():
    layers = model_layers("lenet", (1, 28, 28), 10)
    one, many = step_flops(layers, (1, 28, 28), 1), step_flops(layers, (1, 28, 28), 64)
    assert many.forward == 64 * one.forward and many.backward == 64 * one.backward
    assert many.update == one.update  # per step, not per sample
    assert step_flops(layers, (1, 28, 28), 1, weight_decay=True).update == 6 * one.params


CPUINFO = """processor\t: 0
model name\t: Some CPU
cpu MHz\t\t: 2100.000
flags\t\t: fpu sse2 avx fma avx2 {extra}
processor\t: 1
cpu MHz\t\t: 800.000
"""


def test_speed_peak_estimate_from_cpuinfo_flags_and_clock():
    avx512 = peak_estimate(CPUINFO.format(extra="avx512f"), "float32")
    assert isinstance(avx512, PeakEstimate)
    assert (avx512.vector_bits, avx512.mhz, avx512.lanes) == (512, 2100.0, 16)
    assert avx512.flop_per_cycle(2) == 64 and avx512.flop_per_cycle(1) == 32
    assert avx512.flops(2) == pytest.approx(64 * 2.1e9)
    avx2 = peak_estimate(CPUINFO.format(extra=""), "float32")
    assert avx2.vector_bits == 256 and avx2.flop_per_cycle(2) == 32
    assert peak_estimate(CPUINFO.format(extra="avx512f"), "float64").flop_per_cycle(2) == 32
    assert "fma" in peak_estimate(CPUINFO.replace(" fma", ""), "float32")
    assert "cpu MHz" in peak_estimate(CPUINFO.replace("cpu MHz", "clock"), "float32")
    assert "flags" in peak_estimate("", "float32")


def test_speed_counts_a_gpt_step_from_its_flops_per_token():
    """``syncbench speed --model gpt``: the step is timed on token windows and its FLOPs
    are gpt's per-token count over the batch's tokens, backward twice the forward."""
    from syncbench.bench.data.text import VOCAB
    from syncbench.bench.micro.speed import model_step_flops, step_throughput
    from syncbench.kernels.gpt import flops_per_token, parse_gpt_spec

    name, batch = "gpt:d=32,layers=1,heads=2,ctx=16", 3
    flops = model_step_flops(name, batch)
    forward = flops_per_token(parse_gpt_spec(name), VOCAB)["forward"] * batch * 16
    assert flops.forward == forward and flops.backward == 2 * forward
    assert flops.total == 3 * forward + 4 * flops.params
    rates = step_throughput(name, batch, steps=2, repeats=1)
    assert len(rates) == 1 and rates[0] > 0
