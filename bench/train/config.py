"""The configuration of one training run: typed, frozen, built once from the flags.

``syncbench train`` parses its flags into an ``argparse.Namespace``
(:func:`~syncbench.bench.train.options.add_train_arguments`);
:func:`build_train_config` turns it into a :class:`TrainConfig` and checks it,
once per launch, and the driver, the evaluator, the checkpoints and the
strategy read that value's fields. Nothing downstream guesses a default for a
missing attribute: a field the run lacks is an error where the config is
built. Like PyTorch's ``PeriodicModelAverager``, which checks its arguments in
``__init__``, a bad value is refused here, with one line (``ValueError``), and
never later in a run.

The strategy's own options are one typed value, :attr:`TrainConfig.strategy_options`
(the strategy's ``Options`` dataclass, which validates itself on construction,
:mod:`syncbench.algorithms.flags`). The field names are the flags' ``dest``, so
``config.lr`` is ``--lr``; an option of the run's strategy also reads as
``config.NAME`` (``config.period``), the flat view the namespace gave.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from syncbench.algorithms.flags import options_from
from syncbench.algorithms.local_optimizer import check_local_optimizer, default_learning_rate
from syncbench.algorithms.registry import ALGORITHMS, get_algorithm, validate
from syncbench.analysis.targets import Target, target_of
from syncbench.bench.train.options import (
    add_train_arguments,
    check_data_dir,
    check_strategy_flags,
    target_flags_problem,
)
from syncbench.kernels.zoo import has_batchnorm

#: The run file's ``config`` attribute names the command that wrote it (the
#: dispatcher's ``command`` key, which the namespace carried).
COMMAND = "train"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every flag of ``syncbench train``, one field each (the flag's ``dest``), and the
    run's strategy's typed options."""

    # run
    algorithm: str
    model: str
    dataset: str
    data_dir: str | None
    synthetic_samples: int
    out: str | None
    overwrite: bool
    device: str
    cuda_aware: str  # "yes", "no" or "auto"
    cuda_aware_nonblocking: str  # "yes" or "no"
    dtype: str
    progress: str
    events: str  # "on" or "off"
    scaling_mode: str | None
    # optimization
    epochs: float
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    wd_exempt: bool
    optimizer: str | None  # None: the strategy's default local optimizer
    beta1: float
    beta2: float
    eps: float
    lr_schedule: str
    lr_warmup: int
    sync_bn: bool
    seed: int
    # evaluation
    eval_every: float
    eval_model: str
    target_accuracy: float | None
    target_loss: float | None
    stop_at_target: bool
    # heterogeneity emulation
    slowdown: str | None
    slowdown_schedule: str | None
    slowdown_mode: str
    # reliability
    timeout: float
    flush_every: float
    checkpoint_every: int
    resume: bool
    save_model: str | None
    inject_fault: tuple[int, int, str, str] | None
    #: The ``Options`` of :attr:`algorithm`'s strategy (validated on construction).
    strategy_options: Any

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """The config of the parsed flags ``args``: the run's fields, and the strategy's
        ``Options`` built from its flags (``ValueError``, one line, on an unknown
        ``--algorithm``, another strategy's flag or a bad option value).

        What depends on the ranks or the file system is checked by
        :func:`check_train_config`; :func:`build_train_config` does both."""
        strategy = get_algorithm(args.algorithm)
        check_strategy_flags(args)
        run = {name: getattr(args, name) for name in run_fields()}
        if run["lr"] is None:
            run["lr"] = default_learning_rate(args, strategy.traits)
        return cls(**run, strategy_options=options_from(strategy.Options, args))

    def __getattr__(self, name: str) -> Any:
        """An option of the run's strategy, by its flag's ``dest`` (``config.period``)."""
        if name.startswith("__") or name == "strategy_options":
            raise AttributeError(name)  # unpickling and copying look these up first
        options = self.strategy_options
        if name in {f.name for f in dataclasses.fields(options)}:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__} has no field {name!r}, and "
                             f"{type(options).__qualname__} no option {name!r}")

    def target(self) -> Target | None:
        """The run's target (``--target-accuracy`` or ``--target-loss``), else None."""
        return target_of(self.target_accuracy, self.target_loss)

    def record(self) -> dict[str, Any]:
        """What the run file's ``config`` attribute holds (JSON): every flag by its
        ``dest``, every strategy's options included (another strategy's at their
        defaults, the only values :func:`check_strategy_flags` lets through), and
        ``command``. The same keys and values as the parsed namespace had."""
        values: dict[str, Any] = {"command": COMMAND}
        for strategy in ALGORITHMS.values():
            values.update({f.name: f.default for f in dataclasses.fields(strategy.Options)})
        values.update({name: getattr(self, name) for name in run_fields()})
        values.update(dataclasses.asdict(self.strategy_options))
        return values


def run_fields() -> tuple[str, ...]:
    """The fields of :class:`TrainConfig` that are flags of their own (all but the
    strategy's options)."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "strategy_options")


def check_train_config(config: TrainConfig, world_size: int) -> None:
    """Checks of ``config`` for ``world_size`` ranks on this file system, identical on
    every rank; ``ValueError`` with one line on a problem."""
    cls = get_algorithm(config.algorithm)
    check_data_dir(config)
    targets = target_flags_problem(config.target_accuracy, config.target_loss, config.dataset)
    checks = [
        (config.epochs > 0, f"--epochs must be > 0, got {config.epochs}"),
        (config.batch_size >= 1, f"--batch-size must be >= 1, got {config.batch_size}"),
        (config.lr > 0, f"--lr must be > 0, got {config.lr}"),
        (0 <= config.momentum < 1, f"--momentum must be in [0, 1), got {config.momentum}"),
        (config.weight_decay >= 0, f"--weight-decay must be >= 0, got {config.weight_decay}"),
        (config.lr_warmup >= 0, f"--lr-warmup must be >= 0, got {config.lr_warmup}"),
        (config.algorithm != "asgd" or (config.lr_schedule == "constant"
                                        and not config.lr_warmup),
         "asgd cannot --lr-schedule or --lr-warmup: its server applies --lr as it is"),
        (config.eval_every >= 0, f"--eval-every must be >= 0, got {config.eval_every}"),
        (config.synthetic_samples >= 1,
         f"--synthetic-samples must be >= 1, got {config.synthetic_samples}"),
        (targets is None, targets),
        (not config.stop_at_target or config.target() is not None,
         "--stop-at-target needs --target-accuracy or --target-loss"),
        (not config.stop_at_target or cls.traits.supports_stop_at_target,
         f"{cls.name} cannot --stop-at-target: it has no evaluation points during training "
         "(--target-accuracy or --target-loss alone works)"),
        (cls.traits.supports_checkpoint or not (config.checkpoint_every or config.resume),
         f"{cls.name} cannot --checkpoint-every or --resume"),
        (has_batchnorm(config.model) or not config.sync_bn,
         f"--sync-bn: model {config.model} has no BatchNorm layer"),
        (cls.traits.lock_step or not config.sync_bn,
         f"{cls.name} cannot --sync-bn: its ranks do not take their steps together, and "
         "SyncBatchNorm reduces inside every step"),
        (config.timeout >= 0, f"--timeout must be >= 0, got {config.timeout}"),
        (config.flush_every > 0, f"--flush-every must be > 0, got {config.flush_every}"),
        (config.checkpoint_every >= 0,
         f"--checkpoint-every must be >= 0, got {config.checkpoint_every}"),
        (config.out or not (config.checkpoint_every or config.resume),
         "--checkpoint-every and --resume need --out (state is kept next to the run file)"),
        (config.inject_fault is None or 0 <= config.inject_fault[0] < world_size,
         f"--inject-fault: rank outside 0..{world_size - 1}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if config.out:
        check_out(config.out, config.overwrite or config.resume)
    if config.save_model:
        parent = Path(config.save_model).parent
        if not parent.is_dir():
            raise ValueError(f"--save-model {config.save_model}: directory {parent} does not "
                             "exist")
    check_local_optimizer(config, cls.name, cls.traits)
    validate(cls, config, world_size)


def check_out(out: str, replace: bool) -> None:
    """``--out`` names a file that can be written in an existing, writable folder, and
    that does not exist unless ``replace`` (``--overwrite`` or ``--resume``)."""
    path = Path(out)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--out {out}: directory {parent} is not writable")
    if path.is_dir():
        raise ValueError(f"--out {out} is a folder, not a file")
    if path.exists() and not replace:
        raise ValueError(f"--out {out} exists; pass --overwrite to replace it")


def build_train_config(args: argparse.Namespace, world_size: int) -> TrainConfig:
    """The one way a run's config is made: :meth:`TrainConfig.from_args`, then
    :func:`check_train_config` for ``world_size`` ranks (``ValueError``, one line)."""
    config = TrainConfig.from_args(args)
    check_train_config(config, world_size)
    return config


def default_train_config(**fields: Any) -> TrainConfig:
    """The config of ``syncbench train`` with no flags, then ``fields`` (a run field or
    an option of the strategy, by its ``dest``): for code that drives a strategy
    outside a run (a micro-benchmark) and for tests. Not checked for a world size."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_train_arguments(parser)
    args = parser.parse_args([])
    for name, value in fields.items():
        if not hasattr(args, name):
            raise ValueError(f"syncbench train has no flag for {name!r}")
        setattr(args, name, value)
    return TrainConfig.from_args(args)
