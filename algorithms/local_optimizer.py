"""Which local optimizer a strategy steps with: ``--optimizer sgd|adamw``, chosen in one place.

The core (:class:`~syncbench.algorithms.base.Strategy`) builds its ``optimizer`` with
:func:`build_local_optimizer`; ``syncbench train`` checks the flags with
:func:`check_local_optimizer` before MPI starts. A strategy declares the optimizers it
can step with in its traits (``StrategyTraits.local_optimizers``, its default first):
OD-SGD and ASGD read momentum SGD's velocity and decay (their local corrections, the
server's update), so they take ``sgd`` only; DiLoCo's default is ``adamw``, as the paper's.

``--optimizer`` left out (``None``) is the strategy's default.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.adamw import AdamW, check_adamw
from syncbench.algorithms.lr_schedule import schedule_of
from syncbench.algorithms.optimizer import MomentumSGD

#: ``--optimizer``: momentum SGD (``torch.optim.SGD``'s rule) or AdamW.
LOCAL_OPTIMIZERS = ("sgd", "adamw")


#: ``--lr`` left out: the local optimizer's learning rate. Momentum SGD's 0.05 trains the
#: suite's models at its batch sizes; AdamW normalises each step by the gradient's
#: running RMS, so its step is about lr per coordinate whatever the gradient's scale,
#: and 0.05 diverges (the MLP on Fashion-MNIST under DiLoCo ends at chance);
#: 0.001 is torch.optim.AdamW's default.
DEFAULT_LEARNING_RATES = {"sgd": 0.05, "adamw": 0.001}


def default_learning_rate(config: Any, traits: Any) -> float:
    """The learning rate of a run that left ``--lr`` out: its local optimizer's."""
    return DEFAULT_LEARNING_RATES[local_optimizer_name(config, traits)]


def local_optimizer_name(config: Any, traits: Any) -> str:
    """``--optimizer``, else the strategy's default (the first of its ``local_optimizers``)."""
    return config.optimizer or traits.local_optimizers[0]


def check_optimizer_choice(config: Any, name: str, traits: Any) -> str:
    """The optimizer ``config`` chooses for the strategy ``name``; ``ValueError`` (one line)
    for one that is not an optimizer or that the strategy cannot step with (``train``'s
    check and ``simulate --optimizer``'s)."""
    chosen = local_optimizer_name(config, traits)
    if chosen not in LOCAL_OPTIMIZERS:
        raise ValueError(f"--optimizer must be one of {', '.join(LOCAL_OPTIMIZERS)}, "
                         f"got {chosen}")
    if chosen not in traits.local_optimizers:
        raise ValueError(f"{name} cannot --optimizer {chosen}: it steps with "
                         f"{' or '.join(traits.local_optimizers)} only")
    return chosen


def check_local_optimizer(config: Any, name: str, traits: Any) -> None:
    """``ValueError`` (one line) for an optimizer the strategy ``name`` cannot step with or
    AdamW hyper-parameters out of range."""
    if check_optimizer_choice(config, name, traits) == "adamw":
        check_adamw(*adamw_hyper_parameters(config))


def adamw_hyper_parameters(config: Any) -> tuple[float, float, float]:
    """(beta1, beta2, eps) of ``config`` (``--beta1``, ``--beta2``, ``--eps``)."""
    return float(config.beta1), float(config.beta2), float(config.eps)


def build_local_optimizer(model: Any, config: Any, traits: Any, total_steps: int = 0
                          ) -> MomentumSGD | AdamW:
    """The local optimizer of ``config`` for a strategy with ``traits``, over ``model``'s
    flat parameters (``--wd-exempt``: the model's decay mask), its learning rate under
    ``--lr-schedule`` over ``total_steps`` steps."""
    mask = model.decay_mask() if config.wd_exempt else None
    schedule = schedule_of(config, total_steps)
    if local_optimizer_name(config, traits) == "adamw":
        beta1, beta2, eps = adamw_hyper_parameters(config)
        return AdamW(model.params, config.lr, config.weight_decay, (beta1, beta2), eps, mask,
                     schedule)
    return MomentumSGD(model.params, config.lr, config.momentum, config.weight_decay, mask,
                       schedule)
