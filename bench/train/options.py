"""``syncbench train``'s flags: the run, the optimization, every strategy's options
(generated from their ``Options``), and the checks of a flag against the strategy it
was given with. The typed configuration they become is ``bench/train/config.py``;
the command's help is ``bench/commands/train.py``'s."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from syncbench.algorithms.flags import add_option_flags, flag_name
from syncbench.algorithms.local_optimizer import LOCAL_OPTIMIZERS
from syncbench.algorithms.lr_schedule import SCHEDULES
from syncbench.algorithms.registry import ALGORITHMS, get_algorithm, option_owners
from syncbench.algorithms.timing import PHASES
from syncbench.analysis.targets import target_problem
from syncbench.bench.data.catalog import (
    DATASETS,
    DatasetError,
    canonical_name,
    explicit_dir,
    find_dataset_dir,
    is_text,
)
from syncbench.bench.flags import OnOffAsSwitches, switch
from syncbench.bench.train.slowdown import SLOWDOWN_MODES
from syncbench.kernels.backend import DEVICES
from syncbench.kernels.zoo import MODELS, model_name

#: ``--events``: recording the collectives costs a few microseconds per call.
EVENTS_DEFAULT = "off"


#: Flags (their ``dest``) naming a file that train writes. The runner sets ``out``
#: itself and confines the others to its --out-dir (``experiment.scenario``): a scenario
#: cannot make a run, root under ``--cluster`` included, write anywhere else.
WRITES_FILES = ("out", "save_model")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of one training run; algorithm-specific flags come from the registry.

    Abbreviations are switched off on ``parser``: ``--ou`` or ``--see`` (from a
    scenario's flags, or typed) must not be taken for ``--out`` or ``--seed``."""
    parser.allow_abbrev = False
    run = parser.add_argument_group("run")
    run.add_argument("--algorithm", default="ssgd",
                     help=f"synchronization strategy: {', '.join(ALGORITHMS)}")
    add_model_and_data_arguments(run)
    run.add_argument("--out", default=None,
                     help="run file to write (HDF5, syncbench/1 schema)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    run.add_argument("--device", default="auto", choices=DEVICES,
                     help="compute device: auto takes a CUDA GPU once a probe kernel ran on "
                     "it, else the CPU")
    add_cuda_aware_argument(run, "GPU only: hand device buffers to MPI's BLOCKING "
                            "collectives directly (--cuda-aware) or stage them through pinned "
                            "host memory (--no-cuda-aware); auto, the default, asks the MPI "
                            "library (MPIX_Query_cuda_support), then known environment "
                            "settings, else stages. Nonblocking collectives (Iallreduce: SSGD "
                            "overlap, OD-SGD, Oscars) stay staged unless "
                            "--cuda-aware-nonblocking")
    switch(run, "--cuda-aware-nonblocking", on="yes", off="no", default="no",
           help="GPU only: also hand device buffers to nonblocking collectives when "
           "--cuda-aware is on (off by default: Open MPI reduces nonblocking collectives on "
           "the CPU, coll/libnbc, and device buffers may crash it)")
    run.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                     help="parameter and activation precision")
    run.add_argument("--progress", default="auto", choices=("auto", "always", "never"),
                     help="progress line on rank 0: auto shows it only on a terminal")
    switch(run, "--events", on="on", off="off", default=EVENTS_DEFAULT,
           help="record every collective call (post, completion, bytes, time blocked) in "
           "the run file's /ranks/events: syncbench trace draws them, report counts them; a "
           "full per-rank buffer keeps a stride sample of whole steps")
    run.add_argument("--scaling-mode", default=None, choices=("strong", "weak"),
                     help="label the run as a point of a strong (fixed total work) or weak "
                     "(fixed work per rank) scaling study; recorded as the root attribute "
                     "scaling_mode, which report reads (syncbench sweep sets it)")

    opt = parser.add_argument_group("optimization")
    opt.add_argument("--epochs", type=float, default=1.0,
                     help="sample budget in passes over the training set")
    opt.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
    opt.add_argument("--lr", type=float, default=None,
                     help="learning rate (default: the local optimizer's, 0.05 for sgd, "
                     "0.001 for adamw)")
    opt.add_argument("--momentum", type=float, default=0.9, help="momentum")
    opt.add_argument("--weight-decay", type=float, default=0.0,
                     help="L2 weight decay")
    opt.add_argument("--wd-exempt", action="store_true",
                     help="no weight decay on biases and BatchNorm betas (MXNet's rule: only "
                     "weights and BatchNorm gammas decay), as the OD-SGD paper's scripts train")
    opt.add_argument("--optimizer", default=None, choices=LOCAL_OPTIMIZERS,
                     help="local optimizer: sgd (momentum SGD, --momentum) or adamw (decoupled "
                     "weight decay, torch.optim.AdamW's rule); default the strategy's: adamw "
                     "for diloco, sgd otherwise (odsgd and asgd take sgd only)")
    opt.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1 (default 0.9)")
    opt.add_argument("--beta2", type=float, default=0.999, help="AdamW beta2 (default 0.999)")
    opt.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon (default 1e-8)")
    opt.add_argument("--lr-schedule", default="constant", choices=SCHEDULES,
                     help="the local optimizer's learning rate over the run: constant "
                     "(default), or cosine from --lr down to a tenth of it at the run's last "
                     "step (SGDR without restarts, as nanoGPT and DiLoCo's inner optimizer)")
    opt.add_argument("--lr-warmup", type=int, default=0, metavar="STEPS",
                     help="ramp the learning rate linearly over the first STEPS steps "
                     "(default 0); asgd's server update is not scheduled and refuses both")
    switch(opt, "--sync-bn", default=False,
           help="BatchNorm with the global batch's statistics: one Allreduce per "
           "BatchNorm layer in the forward pass and one in the backward pass (timed in "
           "comm), as PyTorch's SyncBatchNorm; --no-sync-bn: each rank's own batch and "
           "running statistics")
    opt.add_argument("--seed", type=int, default=0,
                     help="seed of the initialisation, the sharding and the sample order "
                     "(the runner's run order is its --order-seed)")

    ev = parser.add_argument_group(
        "evaluation",
        "wall_s (printed as 'wall') is the training time: from the barrier that starts the "
        "run to the end of the last rank's training (including the drain of communication "
        "in flight), minus the time spent evaluating, checkpointing and flushing rows; "
        "samples/s is all ranks' samples over wall_s. time_to_target_s is the training time "
        "of the first evaluation that reached --target-accuracy (a classifier) or "
        "--target-loss (a language model), so it can only take "
        "evaluation times (its resolution is --eval-every).")
    ev.add_argument("--eval-every", type=float, default=0.25,
                    help="evaluate the consensus model every this many epochs "
                    "(0 = only at the end)")
    ev.add_argument("--eval-model", default="global", choices=("global", "local", "both"),
                    help="global (default): the consensus model on the whole test split; "
                    "local: every rank's own weights (OD-SGD: W_loc) and running statistics on "
                    "its shard of the test split, accuracy over all shards, as the OD-SGD "
                    "paper scores it; both: global in /eval, local in /eval_local")
    ev.add_argument("--target-accuracy", type=float, default=None,
                    help="record the training time (wall_s clock) of the first evaluation "
                    "whose test accuracy reaches this (time_to_target_s; resolution: "
                    "--eval-every)")
    ev.add_argument("--target-loss", type=float, default=None, metavar="NATS",
                    help="a language model's target instead: record the training time of "
                    "the first evaluation whose validation loss (nats per token) is at or "
                    "below this (time_to_target_s; one target per run)")
    ev.add_argument("--stop-at-target", action="store_true",
                    help="end training once --target-accuracy or --target-loss is reached")

    het = parser.add_argument_group("heterogeneity emulation")
    het.add_argument("--slowdown", default=None,
                     help="per-rank slowdown factors, e.g. 1,1,1,4 (rank 3 four times slower)")
    het.add_argument("--slowdown-schedule", default=None,
                     help="change factors during training, e.g. '20s:3=1,2=3;40s:0=2' "
                     "(times from the start of training; ranks not named keep their factor)")
    het.add_argument("--slowdown-mode", default="auto", choices=SLOWDOWN_MODES,
                     help="how a slowed rank spends its extra time: work (repeats "
                     "forward/backward on a private model copy), spin (busy-waits), sleep "
                     "(frees its core); auto (default): work when two or more ranks share a "
                     "node, sleep only when every rank has a node to itself")

    rel = parser.add_argument_group("reliability")
    rel.add_argument("--timeout", type=float, default=0.0,
                     help="hang guard: abort the job when a rank makes no progress for this "
                     "many seconds, naming the ranks that had not arrived (0 = off)")
    rel.add_argument("--flush-every", type=float, default=1.0,
                     help="seconds between appends of each rank's new rows next to --out "
                     "(RUN.h5.parts/), for `syncbench recover` after a crash: a crash "
                     "loses at most this much of a rank's rows (default 1)")
    rel.add_argument("--checkpoint-every", type=int, default=0,
                     help="save resumable state every this many steps of one rank, at the "
                     "algorithm's synchronization points (0 = off; needs --out)")
    rel.add_argument("--resume", action="store_true",
                     help="continue the run of --out from its newest complete checkpoint")
    rel.add_argument("--save-model", default=None, metavar="PATH",
                     help="write the final consensus parameters to PATH (.npy, rank 0) and "
                     "what model they are to PATH.json (read by syncbench sample)")
    rel.add_argument("--inject-fault", type=parse_fault, default=None,
                     metavar="RANK:STEP[:PHASE[:MODE]]",
                     help="testing: on RANK, entering PHASE (default compute) of step STEP "
                     "raises an error (MODE raise, default) or blocks forever (MODE hang), "
                     "to check that failures and hangs end the job")

    seen: dict = {}  # flag -> option field, over every strategy: one name, one option
    for cls in ALGORITHMS.values():
        group = parser.add_argument_group(cls.name, f"{cls.summary[:1].upper()}{cls.summary[1:]}.")
        # on/off options: --x/--no-x; each records that it was typed (check_strategy_flags)
        add_option_flags(OnOffAsSwitches(_RecordsTyped(group)), cls.Options, seen)


#: The attribute of the parsed flags that names (by ``dest``) every strategy option typed
#: on the command line or in a scenario, whatever its value: ``--period 4`` typed for SSGD
#: is refused although 4 is Local SGD's default, which the parsed value alone cannot tell
#: from no flag. It is set by the parser itself, so it names exactly the flags the parser
#: matched (no abbreviation or ``--flag=value`` spelling to re-parse); an argparse
#: subparser copies it to the command line's namespace with the other attributes.
TYPED_OPTIONS = "_typed_options"

#: The recording subclass of each argparse action class used by a strategy option.
_TYPED_CLASSES: dict[type, type] = {}


def _typed_class(base: type) -> type:
    """``base`` (an ``argparse.Action`` class) whose call also adds its ``dest`` to the
    namespace's :data:`TYPED_OPTIONS` (a tuple: namespaces copied later share nothing)."""
    if base not in _TYPED_CLASSES:
        def __call__(self: argparse.Action, parser: argparse.ArgumentParser,
                     namespace: argparse.Namespace, values: Any,
                     option_string: str | None = None) -> None:
            typed = getattr(namespace, TYPED_OPTIONS, ())
            setattr(namespace, TYPED_OPTIONS, (*typed, self.dest))
            base.__call__(self, parser, namespace, values, option_string)

        _TYPED_CLASSES[base] = type(f"Typed{base.__name__}", (base,), {"__call__": __call__})
    return _TYPED_CLASSES[base]


class _RecordsTyped:
    """A stand-in for an argument group whose actions record that they were typed
    (:data:`TYPED_OPTIONS`); the flags themselves are added unchanged."""

    def __init__(self, container: argparse._ActionsContainer) -> None:
        self._container = container

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        action = self._container.add_argument(*names, **kwargs)
        action.__class__ = _typed_class(type(action))  # same fields, one more step
        return action

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)


def add_cuda_aware_argument(group: argparse._ActionsContainer, help: str) -> None:
    """``--cuda-aware`` / ``--no-cuda-aware``, auto when neither (train, comm): the body
    reads ``"yes"``, ``"no"`` or ``"auto"``."""
    switch(group, "--cuda-aware", on="yes", off="no", auto="auto", default="auto",
           has_auto=True, help=help)


def add_model_and_data_arguments(group: argparse._ActionsContainer) -> None:
    """``--model``, ``--dataset``, ``--data-dir``, ``--synthetic-samples`` (train, ssgd-comm)."""
    group.add_argument("--model", default="mlp", type=_model_arg, metavar="MODEL",
                       help=f"model: {', '.join(sorted(MODELS))}, mlp:H1,... or gpt:d=N,ctx=N,...")
    group.add_argument("--dataset", default="fashion-mnist", choices=DATASETS, metavar="NAME",
                       help=f"dataset: {', '.join(DATASETS)}")
    group.add_argument("--data-dir", default=None,
                       help="the folder that holds the dataset files, the only place looked "
                       "in (an error if they are not there); without it $SYNCBENCH_DATA, "
                       "then /usr/share/datasets/<name>")
    group.add_argument("--synthetic-samples", type=int, default=8192,
                       help="training samples of the synthetic dataset")


def _model_arg(name: str) -> str:
    """``--model``: a model of the zoo or ``mlp:H1,H2,...``."""
    try:
        return model_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_fault(spec: str) -> tuple[int, int, str, str]:
    """``RANK:STEP[:PHASE[:raise|hang]]`` for ``--inject-fault``."""
    parts = spec.split(":")
    try:
        rank, step = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected RANK:STEP[:PHASE[:raise|hang]], got {spec!r}") from None
    phase = parts[2] if len(parts) > 2 else "compute"
    mode = parts[3] if len(parts) > 3 else "raise"
    if phase not in PHASES or mode not in ("raise", "hang") or len(parts) > 4:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: PHASE must be one of {', '.join(PHASES)} and the mode raise or hang")
    return rank, step, phase, mode


def check_strategy_flags(args: argparse.Namespace) -> None:
    """Refuse an option of another strategy than ``--algorithm``'s in the parsed flags
    ``args`` (``ValueError``, one line naming the flag and the strategies that take it).

    Which strategy takes which flag is what their ``Options`` declare
    (:func:`~syncbench.algorithms.registry.option_owners`). A flag typed is refused
    whatever its value, its default included (:data:`TYPED_OPTIONS`, recorded by
    train's parser); an option not typed is no error at its default (the parser sets
    every strategy's), and refused at another value (flags set by hand, without the
    parser).
    """
    cls = get_algorithm(args.algorithm)
    own = {field.name for field in dataclasses.fields(cls.Options)}
    typed = set(getattr(args, TYPED_OPTIONS, ()))
    for key, (field, owners) in option_owners().items():
        if key in own or not hasattr(args, key):
            continue
        value = getattr(args, key)
        if key not in typed and (value == field.default or value is field.default):
            continue
        flag = flag_name(field)
        shown = _typed_spelling(field, flag, value)
        takers = " and ".join(", ".join(owners).rsplit(", ", 1))
        raise ValueError(f"{shown} applies to --algorithm {takers} only, not to "
                         f"{cls.name}")


def _typed_spelling(field: dataclasses.Field, flag: str, value: Any) -> str:
    """The flag as a user types it for ``value``: ``--overlap``, ``--no-adaptive`` (an
    on/off option), ``--period 4``."""
    if value is True:
        return flag
    if sorted(field.metadata.get("choices") or ()) == ["off", "on"] and value in ("on", "off"):
        return flag if value == "on" else f"--no-{flag[2:]}"
    return f"{flag} {value}"


def check_data_dir(config: Any) -> None:
    """An explicit ``--data-dir`` must be a folder holding ``--dataset``'s files
    (``ValueError``, one line): train never falls back to another copy of the data.
    ``config``: the parsed flags or the built ``TrainConfig``."""
    data_dir = config.data_dir
    if data_dir is None or str(data_dir) == "":
        return
    try:
        if canonical_name(config.dataset) == "synthetic":
            explicit_dir(data_dir)
        else:
            find_dataset_dir(config.dataset, data_dir)
    except DatasetError as exc:
        raise ValueError(str(exc)) from None


def target_flags_problem(accuracy: float | None, loss: float | None,
                         dataset: str) -> str | None:
    """One line on what is wrong with ``--target-accuracy`` / ``--target-loss`` for
    ``dataset``, else None: a bad value, both at once, or a target of the kind the
    dataset is not scored by (a classifier by its test accuracy, a language model by
    its validation loss in nats per token)."""
    problem = target_problem(accuracy, loss)
    if problem:
        return problem
    if accuracy is not None and is_text(dataset):
        return (f"--target-accuracy: {dataset} trains a language model, which is scored by "
                "its held-out loss in nats per token, not an accuracy (give --target-loss)")
    if loss is not None and not is_text(dataset):
        return (f"--target-loss: {dataset} trains a classifier, which is scored by its test "
                "accuracy (give --target-accuracy); a loss target applies to a language model")
    return None


def check_launch(config: argparse.Namespace) -> None:
    """What a launcher checks of a run's parsed flags before it starts the run
    (``syncbench run``'s plan): the strategy's flags, the target against the dataset
    and an explicit ``--data-dir``."""
    get_algorithm(config.algorithm)
    check_strategy_flags(config)
    problem = target_flags_problem(config.target_accuracy, config.target_loss,
                                   config.dataset)
    if problem:
        raise ValueError(problem)
    check_data_dir(config)
