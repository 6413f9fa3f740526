"""FLOPs of one training step of a model, counted from its layers (pure functions).

The convention (what ``syncbench speed`` divides by time):

* a multiply-add is 2 FLOP;
* ``Conv2d`` forward: ``2 * cout * cin * k * k * oh * ow`` per sample (``oh``,
  ``ow`` from :meth:`Layer.output_shape`, so padding and stride are in them);
  ``Linear`` forward: ``2 * in_features * out_features`` per sample;
* backward = weight gradient + input gradient, each as many FLOPs as the
  forward. The input gradient of the model's first layer with parameters
  (``Model.first_trained``, whose ``needs_input_grad`` is False) is never
  computed and not counted; the layers below it run no backward at all.
  Inside a ``BasicBlock`` both convolutions compute their input gradient
  (the block's own flag only drops the shortcut's); the option-A shortcut
  (subsampling, zero channels) has no FLOPs;
* the momentum update: 4 FLOP per parameter (``v *= mu``, ``v += g``,
  ``lr * v``, ``w -= ...``: :func:`syncbench.kernels.ops.sgd_momentum_`), 6
  with weight decay (``wd * w`` and its sum);
* excluded, counted nowhere: bias addition and bias gradient, ReLU, max
  pooling, BatchNorm, the residual sum, global average pooling, the softmax
  cross-entropy and the im2col/col2im copies. Each costs a few operations per
  activation, against ``fan_in`` multiply-adds per activation for the
  GEMMs; in ``lenet`` at one operation per element each way they would add
  under 2 % to the step.

All counts are exact integers, for ``batch`` samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from syncbench.kernels.layers import BasicBlock, Conv2d, Layer, Linear, first_trained

Shape = tuple[int, ...]

#: FLOPs per parameter of one momentum-SGD update, without and with weight decay.
UPDATE_FLOPS_PER_PARAM = {False: 4, True: 6}


@dataclass(frozen=True)
class LayerFlops:
    """The GEMM FLOPs of one ``Conv2d`` or ``Linear`` for a batch.

    ``layer``: its index in the model's top-level layers (a block's
    convolutions share the block's); ``name``: ``"<index>"`` or
    ``"<index>.conv1"`` and the layer's repr.
    """

    layer: int
    name: str
    forward: int
    weight_grad: int
    input_grad: int

    @property
    def backward(self) -> int:
        return self.weight_grad + self.input_grad

    @property
    def total(self) -> int:
        return self.forward + self.backward


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step (forward, backward, momentum update) for ``batch`` samples."""

    batch: int
    layers: tuple[LayerFlops, ...]
    params: int
    update_per_param: int

    @property
    def forward(self) -> int:
        return sum(entry.forward for entry in self.layers)

    @property
    def backward(self) -> int:
        return sum(entry.backward for entry in self.layers)

    @property
    def update(self) -> int:
        return self.params * self.update_per_param

    @property
    def total(self) -> int:
        """Forward + backward + update: what ``syncbench speed`` calls FLOP per step."""
        return self.forward + self.backward + self.update

    def as_dict(self) -> dict:
        """Plain numbers for JSON: the totals and one entry per GEMM layer."""
        return {"batch": self.batch, "forward": self.forward, "backward": self.backward,
                "update": self.update, "total": self.total, "params": self.params,
                "update_per_param": self.update_per_param,
                "layers": [{"layer": e.layer, "name": e.name, "forward": e.forward,
                            "weight_grad": e.weight_grad, "input_grad": e.input_grad}
                           for e in self.layers]}


def param_count(layers: Sequence[Layer]) -> int:
    """Number of parameters of ``layers`` (``Model.size``), from their shapes."""
    return sum(int(np.prod(shape)) for layer in layers for shape in layer.param_shapes())


def gemm_forward_per_sample(layer: Layer, input_shape: Shape) -> int:
    """Forward FLOPs of one sample through a ``Conv2d`` or ``Linear`` (0 for other layers)."""
    if isinstance(layer, Conv2d):
        _, oh, ow = layer.output_shape(tuple(input_shape))
        return 2 * layer.cout * layer.cin * layer.k * layer.k * oh * ow
    if isinstance(layer, Linear):
        return 2 * layer.in_features * layer.out_features
    return 0


def layer_flops(layers: Sequence[Layer], input_shape: Shape, batch: int = 1) -> list[LayerFlops]:
    """One entry per ``Conv2d`` and ``Linear`` (inside blocks too), in forward order, for
    ``batch`` samples of per-sample shape ``input_shape``."""
    first = first_trained(layers)
    out: list[LayerFlops] = []
    shape = tuple(input_shape)
    for index, layer in enumerate(layers):
        trained = index >= first
        if isinstance(layer, BasicBlock):
            inner = shape
            names = {id(v): k for k, v in vars(layer).items() if isinstance(v, Layer)}
            for position, sub in enumerate(layer.sublayers()):
                name = names.get(id(sub), str(position))
                fwd = batch * gemm_forward_per_sample(sub, inner)
                if fwd:
                    out.append(LayerFlops(index, f"{index}.{name} {sub!r}", fwd,
                                          fwd if trained else 0, fwd if trained else 0))
                inner = sub.output_shape(inner)
        else:
            fwd = batch * gemm_forward_per_sample(layer, shape)
            if fwd:
                out.append(LayerFlops(index, f"{index} {layer!r}", fwd, fwd if trained else 0,
                                      fwd if index > first else 0))
        shape = layer.output_shape(shape)
    return out


def step_flops(layers: Sequence[Layer], input_shape: Shape, batch: int,
               weight_decay: bool = False) -> StepFlops:
    """FLOPs of one training step of ``layers`` on ``batch`` samples (see the module
    docstring for what is counted)."""
    return StepFlops(batch, tuple(layer_flops(layers, input_shape, batch)),
                     param_count(layers), UPDATE_FLOPS_PER_PARAM[bool(weight_decay)])


def per_layer_table(step: StepFlops) -> list[str]:
    """Fixed-column lines: every GEMM layer's forward, weight- and input-gradient MFLOP, then
    the totals and the update."""
    lines = [f"# {'layer':<58}{'fwd MFLOP':>11}{'dW MFLOP':>10}{'dX MFLOP':>10}"]
    for e in step.layers:
        lines.append(f"  {e.name:<58}{e.forward / 1e6:>11.3f}{e.weight_grad / 1e6:>10.3f}"
                     f"{e.input_grad / 1e6:>10.3f}")
    lines.append(f"  {'total (GEMMs)':<58}{step.forward / 1e6:>11.3f}"
                 f"{sum(e.weight_grad for e in step.layers) / 1e6:>10.3f}"
                 f"{sum(e.input_grad for e in step.layers) / 1e6:>10.3f}")
    lines.append(f"  update: {step.params} parameters x {step.update_per_param} FLOP = "
                 f"{step.update / 1e6:.3f} MFLOP; step total {step.total / 1e6:.3f} MFLOP "
                 f"(batch {step.batch})")
    return lines


if __name__ == "__main__":  # python -m syncbench.kernels.flops [MODEL ...]: per-layer tables
    import sys

    from syncbench.kernels.zoo import model_layers

    for model_name in sys.argv[1:] or ["mlp", "lenet", "resnet8", "resnet20"]:
        print(f"# {model_name}, 1x28x28, batch 64")
        print("\n".join(per_layer_table(step_flops(model_layers(model_name, (1, 28, 28), 10),
                                                   (1, 28, 28), 64))))
