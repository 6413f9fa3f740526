"""The PyTorch peers (DDP, PeriodicModelAverager) and ``syncbench peers``.

* the peer models have our architectures (same parameter counts and shapes);
  the BatchNorm ResNets (``resnet8``, ``resnet20``) have He et al.'s CIFAR
  architecture: parameter counts worked out by hand, planes 28-14-7 and
  32-16-8, the option-A shortcut, the suite's initialisation, and one
  training step updates every parameter and the running statistics;
* the peer runner, launched on 2 ranks under our ``mpiexec``, trains (the
  loss falls, the accuracy is far above chance) and computes what it claims:
  its final parameters equal a serial re-computation on the same shards and
  batches (DDP: one model on both ranks' batches together, up to rounding;
  with BatchNorm, two replicas each normalising its own batch and stepping
  with the mean gradient; Local SGD: two replicas averaged every
  ``--period`` steps and at the end, bit for bit, and with BatchNorm the
  running statistics averaged with them: rank 0's test loss is the serial
  replica's);
* ``syncbench peers`` prints parseable fixed-column rows with the ratio of
  the medians, and the SSGD communication-efficiency row.

Skipped as a whole when PyTorch is not installed (``pip install 'syncbench[peers]'``).

Split off this module: ``tests/e2e/test_peers_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: pip install 'syncbench[peers]' (torch==2.13.0)")

from torch.nn import functional as F  # noqa: E402

from syncbench.bench.experiment.peers.torch_runner import (  # noqa: E402
    MODELS,
    build_torch_model,
    rank_and_size,
    step_throughput,
)
from syncbench.kernels.zoo import build_model  # noqa: E402


def _resnet_size(blocks: int, in_channels: int, num_classes: int) -> int:
    """Parameters of the CIFAR ResNet with ``blocks`` blocks per stage, counted by hand."""
    conv = lambda cin, cout: cin * cout * 9  # noqa: E731 - 3x3, no bias
    bn = lambda c: 2 * c  # noqa: E731 - gamma, beta
    size = conv(in_channels, 16) + bn(16)
    cin = 16
    for cout in (16, 32, 64):
        for _ in range(blocks):
            size += conv(cin, cout) + bn(cout) + conv(cout, cout) + bn(cout)
            cin = cout
    return size + 64 * num_classes + num_classes


def test_peer_models_have_our_architectures():
    for name in MODELS:
        ours = build_model(name, (1, 28, 28), 10)
        theirs = build_torch_model(name, (1, 28, 28), 10)
        assert sum(p.numel() for p in theirs.parameters()) == ours.size
        shapes = sorted(tuple(p.shape) for p in theirs.parameters())
        assert len(shapes) == sum(len(layer.param_shapes()) for layer in ours.layers)
        assert theirs(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    for name, shape in (("resnet8", (1, 28, 28)), ("resnet20", (3, 32, 32))):
        # flat order parameter for parameter: torch's Linear weight is the suite's transposed
        ours = [s for layer in build_model(name, shape, 10).layers for s in layer.param_shapes()]
        theirs = [tuple(p.shape) for p in build_torch_model(name, shape, 10).parameters()]
        assert theirs[:-2] == [tuple(s) for s in ours[:-2]]
        assert theirs[-2:] == [tuple(reversed(ours[-2])), tuple(ours[-1])]
        with pytest.raises(ValueError, match="28x28 or 32x32"):
            build_torch_model(name, (shape[0], 30, 30), 10)


def test_peer_resnets_have_he_et_al_cifar_architecture():
    assert MODELS == ("mlp", "lenet", "resnet8", "resnet20")
    resnet8 = build_torch_model("resnet8", (1, 28, 28), 10)
    # conv + BN, stage 1, stage 2, stage 3, linear (the numbers of the issue)
    expected = (144 + 32 + 2 * (2304 + 32) + 4608 + 64 + 9216 + 64
                + 18432 + 128 + 36864 + 128 + 650)
    assert expected == 75002 == _resnet_size(1, 1, 10)
    assert sum(p.numel() for p in resnet8.parameters()) == expected
    resnet20 = build_torch_model("resnet20", (3, 32, 32), 10)
    assert sum(p.numel() for p in resnet20.parameters()) == _resnet_size(3, 3, 10) == 269722
    assert (sum(p.numel() for p in build_torch_model("resnet20", (1, 28, 28), 100).parameters())
            == _resnet_size(3, 1, 100))
    # parameters() order: stem conv, BN gamma, beta; per block conv, BN, BN, conv, BN, BN;
    # linear weight (out, in) and bias
    shapes = [tuple(p.shape) for p in resnet8.parameters()]
    assert shapes[:6] == [(16, 1, 3, 3), (16,), (16,), (16, 16, 3, 3), (16,), (16,)]
    assert shapes[9:12] == [(32, 16, 3, 3), (32,), (32,)]
    assert shapes[-2:] == [(10, 64), (10,)]
    assert len(shapes) == 3 + 6 * 3 + 2
    assert len([p for p in resnet20.parameters()]) == 3 + 6 * 9 + 2
    for name, shape, planes in (("resnet8", (1, 28, 28), (28, 14, 7)),
                                ("resnet20", (3, 32, 32), (32, 16, 8))):
        model = build_torch_model(name, shape, 10)
        x, seen = torch.zeros(3, *shape), []
        for module in model:  # the Sequential's layers, in order
            x = module(x)
            if type(module).__name__ == "BasicBlock":
                seen.append(tuple(x.shape[1:]))
        assert x.shape == (3, 10)
        blocks = len(seen) // 3
        assert seen == [(c, p, p) for c, p in zip((16, 32, 64), planes) for _ in range(blocks)]


def test_peer_resnet_shortcut_bn_and_initialisation():
    model = build_torch_model("resnet8", (1, 28, 28), 10)
    shortcut = model[4].shortcut  # stage 2's first block: 16 -> 32 channels, stride 2
    x = torch.randn(2, 16, 28, 28)
    out = shortcut(x)
    assert out.shape == (2, 32, 14, 14)
    assert torch.equal(out[:, :16], x[:, :, ::2, ::2])  # the input's channels first
    assert not out[:, 16:].any()  # then zeros (appended, not split on both sides)
    assert not list(shortcut.parameters())
    assert type(model[3].shortcut).__name__ == "Identity"
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            assert (module.eps, module.momentum) == (1e-5, 0.1)
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert not module.bias.any() and not module.running_mean.any()
            assert torch.equal(module.running_var, torch.ones_like(module.running_var))
        elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = module.weight[0].numel()
            bound = math.sqrt(6.0 / fan_in)
            w = module.weight.detach()
            assert w.abs().max() <= bound and w.abs().max() > 0.8 * bound  # sqrt(6/fan_in)
            if isinstance(module, torch.nn.Conv2d):
                assert module.bias is None
            else:
                assert not module.bias.any()


@pytest.mark.parametrize("name", ["resnet8", "resnet20"])
def test_peer_resnet_training_step_updates_parameters_and_statistics(name):
    torch.manual_seed(0)
    model = build_torch_model(name, (1, 28, 28), 10)
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert math.isfinite(float(loss.detach()))
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert model[1].running_mean.any() and int(model[1].num_batches_tracked) == 1
    model.eval()  # running statistics: the same output for the same input
    with torch.no_grad():
        assert torch.equal(model(x[:2]), model(x[:2]))
    assert step_throughput(name, 4, 1) > 0


def test_rank_and_size_from_launcher_environments():
    assert rank_and_size({"PMI_RANK": "3", "PMI_SIZE": "4"}) == (3, 4)
    assert rank_and_size({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert rank_and_size({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) == (0, 8)
    assert rank_and_size({}) == (0, 1)


def test_peers_plan_alternates_ours_and_the_peer_and_keeps_complete_peer_records(tmp_path):
    import argparse
    import json

    from syncbench.bench.commands.peers import add_arguments
    from syncbench.bench.experiment.peers.pairs import plan_cell
    from syncbench.bench.experiment.plan import kept_run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--repeats", "2", "--train-flags", "--comm blocking"])
    plan = plan_cell(args, 2, "mlp", "ssgd", tmp_path)
    assert [(p.repeat, p.program) for p in plan] == [
        (0, "train"), (0, "torch"), (1, "train"), (1, "torch")]
    ours, peer = plan[:2]
    assert ours.args[:2] == ("--algorithm", "ssgd") and "blocking" in ours.args
    assert "--comm" not in peer.args and peer.args[-2:] == ("--out", str(peer.path))
    # the runner's resume check reads a peer's record as the run file of its point
    assert kept_run(peer) == (None, "")
    record = {"peer": "torch-ddp", "algorithm": "ssgd", "world_size": 2,
              "samples_per_s": 1.0, "accuracy": 0.5}
    peer.path.write_text(json.dumps(record))
    assert kept_run(peer) == (record, "")
    peer.path.write_text(json.dumps({**record, "world_size": 4}))
    assert kept_run(peer)[0] is None


def test_the_gpt_twin_steps_from_our_initial_parameters_under_speed():
    """peers --speed --model gpt:...: the twin starts from our model's parameters on the
    same token windows, so both steps do the same work; the data-parallel peers take no
    gpt (one line), and a spec's own commas stay in it."""
    import argparse

    from syncbench.bench.experiment.peers.pairs import usage_error
    from syncbench.kernels.zoo import split_models

    spec = "gpt:d=16,layers=1,heads=2,ctx=16"
    assert step_throughput(spec, 2, 1) > 0
    assert split_models(f"mlp:32,16,{spec},lenet") == ["mlp:32,16", spec, "lenet"]
    flags = dict(algorithms="ssgd", repeats=1, comm_blocks=0, comm_block_steps=1,
                 train_flags="", out_dir=None)
    assert usage_error(argparse.Namespace(speed=True, model=spec, **flags), ["ssgd"],
                       [spec]) is None
    wrong = usage_error(argparse.Namespace(speed=False, model=spec, **flags), ["ssgd"], [spec])
    assert "gpt[:SPEC] with --speed" in wrong
