"""Compatibility name of :mod:`syncbench.kernels.zoo` (the model zoo).

:mod:`syncbench.kernels.model` is the flat-buffer ``Model`` itself.
"""

from syncbench.kernels.zoo import (  # noqa: F401
    MODELS,
    build_model,
    lenet_layers,
    mlp_layers,
    model_name,
    parse_mlp_widths,
)
