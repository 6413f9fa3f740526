"""The first screens of ``syncbench`` and its bad-flag ending, serial and under mpiexec: the
tests that launch nothing and load no MPI.

Split off e2e/test_cli.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import argparse
import re
import time

import pytest

from syncbench.bench import flags
from syncbench.bench.cli import COMMANDS, build_parser, mpi_not_started
from syncbench.bench.mpi.errors import folded, launcher_rank


def _help(*words: str) -> str:
    """The help of ``syncbench WORDS`` (a command, or a command's action), one line."""
    with mpi_not_started():
        parser = build_parser(words[0])
    for word in words:
        parser = _subparsers(parser)[word]
    return folded(parser.format_help())


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return found[0].choices if found else {}


def _every_help() -> list[tuple[str, ...]]:
    """Every command and every nested action (``cluster up``)."""
    words = []
    for name in COMMANDS:
        words.append((name,))
        with mpi_not_started():
            command = _subparsers(build_parser(name))[name]
        words += [(name, action) for action in _subparsers(command)]
    return words


@pytest.mark.parametrize("words", _every_help(), ids=" ".join)
def test_every_help_is_in_plain_words(words):
    text = _help(*words)
    assert text.startswith(f"usage: syncbench {' '.join(words)}")
    for markup in (":func:", ":mod:", ":class:", ":data:", ":meth:", "``", "pydoc",
                   "command's body", "::"):
        assert markup not in text, (markup, text)
    # Module paths are for the code's readers (pydoc), not for a command's users.
    assert not re.search(r"syncbench\.(analysis|bench|algorithms|kernels)\.", text), text


def test_every_flag_ends_with_its_default_once():
    for words in _every_help():
        with mpi_not_started():
            parser = build_parser(words[0])
        for word in words:
            parser = _subparsers(parser)[word]
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.help in (None, argparse.SUPPRESS):
                continue
            shown = formatter._expand_help(action)
            assert shown.count("(default: ") <= 1, shown
            if action.nargs == 0:  # a switch: off unless given
                assert "(default: False)" not in shown, (words, action.option_strings)
            elif action.default not in (None, "", []):
                assert "default" in shown.lower(), (words, action.option_strings, shown)
            if "default" in action.help.lower():  # stated by hand: nothing appended
                assert "(default: " not in shown or "(default: " in action.help, shown


def test_train_help_shows_the_defaults_it_lacked():
    text = _help("train")
    assert "sample budget in passes over the training set (default: 1.0)" in text
    assert ("--lr LR learning rate (default: the local optimizer's, 0.05 for sgd, 0.001 "
            "for adamw)") in text
    assert "--batch-size BATCH_SIZE per-rank batch (default: 64)" in text
    assert "(default 1) (default" not in text and "--out OUT run file to write (HDF5, " \
        "syncbench/1 schema) " in text


#: Every old spelling (command, old argv, the same with the chosen spelling): each still
#: parses to what the chosen one gives, with one line naming the chosen one (docs/FLAGS.md).
OLD_SPELLINGS = [
    ("train", ["--events", "on"], ["--events"]),
    ("train", ["--events", "off"], ["--no-events"]),
    ("train", ["--cuda-aware", "yes"], ["--cuda-aware"]),
    ("train", ["--cuda-aware", "no"], ["--no-cuda-aware"]),
    ("train", ["--cuda-aware", "auto"], []),
    ("train", ["--cuda-aware-nonblocking", "yes"], ["--cuda-aware-nonblocking"]),
    ("train", ["--adaptive=off"], ["--no-adaptive"]),
    ("train", ["--local-lookahead", "on"], ["--local-lookahead"]),
    ("run", ["demo", "--seed", "3"], ["demo", "--order-seed", "3"]),
    ("compare", ["--seed", "3"], ["--order-seed", "3"]),
    ("sweep", ["--no-run"], ["--collect-only"]),
    ("report", ["a.h5", "--output", "t.csv"], ["a.h5", "--out", "t.csv"]),
    ("speed", ["--models", "mlp"], ["--model", "mlp"]),
    ("speed", ["--json", "f.txt"], ["--out", "f.txt", "--format", "json"]),
    ("ssgd-comm", ["--json", "f.json"], ["--out", "f.json", "--format", "json"]),
    ("ssgd-comm", ["--warmup-steps", "2"], ["--untimed-steps", "2"]),
    ("comm", ["--cuda-aware", "yes"], ["--cuda-aware"]),
    ("peers", ["--models", "mlp,lenet"], ["--model", "mlp,lenet"]),
    ("data", ["fetch", "mnist", "--dest", "d"], ["fetch", "mnist", "--out-dir", "d"]),
    ("simulate", ["--device", "h100"], ["--hardware", "h100"]),
    ("simulate", ["--device-flops", "1e15"], ["--hardware-flops", "1e15"]),
    ("simulate", ["--adaptive", "on"], ["--adaptive"]),
]


#: The chosen spelling of each idea, per command (docs/FLAGS.md), and old ones --help hides.
VOCABULARY = {
    ("train",): ["--out", "--seed", "--model", "--events", "--no-events", "--sync-bn",
                 "--no-sync-bn", "--cuda-aware", "--no-cuda-aware", "--adaptive",
                 "--no-adaptive"],
    ("run",): ["--out-dir", "--order-seed", "--dry-run", "--np", "--run-timeout"],
    ("compare",): ["--out-dir", "--order-seed", "--dry-run", "--np", "--run-timeout"],
    ("sweep",): ["--out-dir", "--order-seed", "--dry-run", "--collect-only", "--np",
                 "--run-timeout"],
    ("report",): ["--out"],
    ("trace",): ["--out"],
    ("comm",): ["--out", "--cuda-aware", "--no-cuda-aware"],
    ("ssgd-comm",): ["--out", "--model", "--seed"],
    ("speed",): ["--out", "--model"],
    ("peers",): ["--out-dir", "--model", "--np", "--seed", "--run-timeout"],
    ("simulate",): ["--out", "--np", "--seed", "--hardware"],
    ("data", "fetch"): ["--out-dir"],
    ("data", "info"): ["--data-dir"],
}


HIDDEN = ["--output", "--json", "--dest", "--no-run", "--models", "--device-flops"]


@pytest.fixture(autouse=True)
def _fresh_deprecations():
    """Each test sees every old spelling's line (the lines are once per process)."""
    flags._announced.clear()
    yield
    flags._announced.clear()


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    with mpi_not_started():
        parser = build_parser(command)
        return parser.parse_known_args([command, *argv])[0]


@pytest.mark.parametrize(("command", "old", "new"), OLD_SPELLINGS,
                         ids=[" ".join((c, *o)) for c, o, _ in OLD_SPELLINGS])
def test_every_old_spelling_still_works_with_one_line(command, old, new, capsys):
    chosen = _parse(command, new)
    assert capsys.readouterr().err == ""
    assert vars(_parse(command, old)) == vars(chosen)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"syncbench {command}" in err, err
    assert "is an old spelling; use '" in err and "docs/FLAGS.md" in err, err
    said = err.split("use '")[1]
    assert next((w for w in new if w.startswith("--")), "neither") in said, err
    _parse(command, old)  # again in the same process: no second line
    assert capsys.readouterr().err == ""


def test_an_old_spelling_says_nothing_on_other_ranks(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "1")
    assert _parse("train", ["--events", "on"]).events == "on"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("words", list(VOCABULARY), ids=" ".join)
def test_every_help_shows_the_chosen_spellings_and_hides_the_old(words):
    with mpi_not_started():
        parser = build_parser(words[0])
    for word in words:
        parser = _subparsers(parser)[word]
    shown = {s for a in parser._actions if a.help != argparse.SUPPRESS
             for s in a.option_strings}
    text = _help(*words)
    for flag in VOCABULARY[words]:
        assert flag in shown and re.search(rf"{flag}( |,|\]|$)", text), (words, flag)
    assert not shown & set(HIDDEN), (words, shown & set(HIDDEN))


#: Old spellings as a help text would show them (``--events on``, ``--json PATH``).
OLD_IN_TEXT = re.compile(r"--(json|models|dest|output|no-run)\b|--(events|sync-bn|adaptive|"
                         r"local-lookahead|cuda-aware|cuda-aware-nonblocking) "
                         r"(on|off|yes|no|auto)\b")


@pytest.mark.parametrize("words", _every_help(), ids=" ".join)
def test_no_help_text_teaches_an_old_spelling(words):
    text = _help(*words)
    assert not OLD_IN_TEXT.search(text), OLD_IN_TEXT.search(text)


def test_one_default_per_idea():
    assert _parse("run", ["demo"]).run_timeout == _parse("sweep", []).run_timeout == \
        _parse("compare", []).run_timeout == 1800
    assert _parse("run", ["demo", "--run-timeout", "0"]).run_timeout is None  # no limit
    assert _parse("train", []).cuda_aware == _parse("comm", []).cuda_aware == "auto"
    assert _parse("train", ["--no-cuda-aware"]).cuda_aware == "no"
    assert _parse("train", ["--sync-bn"]).sync_bn is True
    assert _parse("train", ["--sync-bn", "--no-sync-bn"]).sync_bn is False


def test_trace_help_shows_the_value_not_the_constant():
    text = _help("trace")
    assert "DEFAULT_MAX_RANKS" not in text and "(default 256; 0: no limit)" in text


def test_data_actions_have_their_own_usage():
    fetch, info = _help("data", "fetch"), _help("data", "info")
    assert fetch.startswith("usage: syncbench data fetch") and "--out-dir DIR" in fetch
    assert "--data-dir" not in fetch and "--out-dir" not in info
    assert info.startswith("usage: syncbench data info") and "--data-dir" in info


def test_a_scenario_false_turns_a_switch_off_even_where_it_is_on_by_default():
    """``adaptive = false`` in a scenario is --no-adaptive (Oscars' default is on: leaving
    the flag out would have run the adaptive schedule); a store_true flag stays off."""
    from syncbench.bench.experiment.scenario import parse_scenario
    from syncbench.bench.train.options import add_train_arguments

    scenario = parse_scenario({"np": 2, "run": [{"label": "o", "algorithm": "oscars", "flags": {
        "adaptive": False, "overlap": False, "local_lookahead": True}}]}, "x", "x")
    (run,) = scenario.runs
    assert run.flags == ("--no-adaptive", "--local-lookahead")
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    config = parser.parse_args(["--algorithm", "oscars", *run.flags])
    assert config.adaptive == "off" and config.overlap is False


def test_launcher_rank_prefers_the_launchers_own_variable():
    assert launcher_rank({}) == 0
    assert launcher_rank({"SLURM_PROCID": "3"}) == 3
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "2", "PMIX_RANK": "2"}) == 2
    # Hydra inside a Slurm allocation: SLURM_PROCID numbers its proxies, PMI_RANK the ranks.
    assert launcher_rank({"PMI_RANK": "1", "SLURM_PROCID": "0"}) == 1
    assert launcher_rank({"PMI_RANK": "", "SLURM_PROCID": "0"}) == 0


def test_a_rank_that_does_not_print_exits_after_rank_0_had_time_to(monkeypatch, capsys):
    """Open MPI's launcher kills the job at the first non-zero exit: the other ranks wait."""
    from syncbench.bench.mpi import errors as cli

    for name in cli.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    started = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        cli.fail("syncbench train", "argument --model: invalid choice")
    assert exc.value.code == 2 and capsys.readouterr().err == ""
    assert 0.5 <= cli.ERROR_EXIT_GRACE_S <= time.monotonic() - started < 5
