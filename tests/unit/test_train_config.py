"""``TrainConfig``: one typed, frozen value per run, built from train's flags and checked
there; the run file's ``config`` record is the parsed flags, key for key."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
from helpers import train_args, train_config

from syncbench.algorithms.registry import ALGORITHMS, option_owners
from syncbench.bench.cli import build_parser
from syncbench.bench.train.config import (
    TrainConfig,
    build_train_config,
    default_train_config,
    run_fields,
)

#: Flag sets whose record must equal the namespace (options of the run's strategy, the
#: others' at their defaults, not typed: train refuses them typed, a tuple-valued flag,
#: None and paths).
FLAG_SETS = [
    (),
    ("--algorithm", "oscars", "--period", "3", "--overlap", "--max-period", "12"),
    ("--algorithm", "ssgd", "--comm", "blocking", "--bucket-mb", "2"),
    ("--algorithm", "asgd", "--ps-layout", "dedicated", "--worker-momentum", "0.25"),
    ("--algorithm", "odsgd", "--lr-local", "0.2", "--local-lookahead", "on"),
    ("--algorithm", "localsgd", "--inject-fault", "1:3:comm:hang", "--out", "x.h5",
     "--target-accuracy", "0.5", "--sync-bn", "--model", "lenet", "--seed", "7"),
]


def _dests() -> set[str]:
    parser = build_parser("train")
    train = parser._subparsers._group_actions[0].choices["train"]
    return {a.dest for a in train._actions if a.dest != "help"}


def test_one_field_per_train_flag_and_the_options_apart():
    options = set(option_owners())
    assert set(run_fields()) == _dests() - options
    assert "strategy_options" in {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(run_fields()).isdisjoint(options)


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: " ".join(f) or "defaults")
def test_the_record_is_the_parsed_flags(flags):
    args = train_args(*flags)
    config = TrainConfig.from_args(args)
    # every flag as parsed, --lr left out as the learning rate the run uses (the parser's
    # note of the strategy flags typed, _typed_options, is no flag)
    parsed = {**{k: v for k, v in vars(args).items() if not k.startswith("_")},
              "lr": args.lr if args.lr is not None else 0.05}
    assert config.record() == parsed
    assert (json.dumps(config.record(), sort_keys=True, default=str)
            == json.dumps(parsed, sort_keys=True, default=str))


def test_the_strategys_options_are_one_typed_value_also_read_by_name():
    config = train_config("--algorithm", "oscars", "--period", "3", "--overlap")
    options = ALGORITHMS["oscars"].Options(period=3, overlap=True)
    assert config.strategy_options == options
    assert (config.period, config.overlap) == (3, True)
    with pytest.raises(AttributeError, match="no option 'ps_layout'"):
        config.ps_layout  # noqa: B018  asgd's option, not this run's
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 0.1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.replace(config, lr=0.5).lr == 0.5


@pytest.mark.parametrize(("flags", "message"), [
    (("--lr", "0"), "--lr must be > 0, got 0.0"),
    (("--momentum", "1"), r"--momentum must be in \[0, 1\), got 1.0"),
    (("--algorithm", "localsgd", "--period", "0"), "--period must be >= 1, got 0"),
    (("--algorithm", "ssgd", "--period", "2"),
     "--period 2 applies to --algorithm localsgd, oscars and slowmo only, not to ssgd"),
    (("--algorithm", "nope"), "nope"),
    (("--inject-fault", "2:1"), r"--inject-fault: rank outside 0..1"),
    (("--resume",), "--checkpoint-every and --resume need --out"),
    (("--algorithm", "asgd", "--ps-layout", "dedicated", "--model", "resnet8"),
     "asgd --ps-layout dedicated cannot train resnet8"),
    (("--dataset", "shakespeare", "--model", "gpt", "--target-accuracy", "0.5"),
     "--target-accuracy: shakespeare trains a language model"),
])
def test_a_bad_value_is_one_line_where_the_config_is_built(flags, message):
    with pytest.raises(ValueError, match=message) as raised:
        build_train_config(train_args(*flags), 2)
    assert "\n" not in str(raised.value)


def test_out_is_checked_against_the_file_system(tmp_path):
    out = tmp_path / "run.h5"
    assert build_train_config(train_args("--out", str(out)), 2).out == str(out)
    out.write_bytes(b"")
    with pytest.raises(ValueError, match=f"--out {out} exists; pass --overwrite"):
        build_train_config(train_args("--out", str(out)), 2)
    assert build_train_config(train_args("--out", str(out), "--overwrite"), 2).overwrite
    with pytest.raises(ValueError, match="directory .* does not exist"):
        build_train_config(train_args("--out", str(tmp_path / "no" / "run.h5")), 2)


def test_default_config_with_fields():
    config = default_train_config(lr=0.2, momentum=0.5, weight_decay=0.0, comm="blocking")
    assert (config.lr, config.momentum, config.wd_exempt) == (0.2, 0.5, False)
    assert config.strategy_options == ALGORITHMS["ssgd"].Options(comm="blocking")
    assert default_train_config() == train_config()
    with pytest.raises(ValueError, match="no flag for 'learning_rate'"):
        default_train_config(learning_rate=0.1)
