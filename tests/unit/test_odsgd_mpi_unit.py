"""OD-SGD under MPI equals a serial float64 re-computation of its recurrence: the tests that
launch nothing and load no MPI.

Split off e2e/test_odsgd_mpi_e2e.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import pytest
from helpers import train_config

from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.analysis.labels import run_label


def test_odsgd_flags_are_validated():
    cls = get_algorithm("odsgd")
    for flags in (("--warmup-steps", "-1"), ("--lr-local", "0"), ("--dc-lambda", "-1"),
                  ("--local-momentum", "-0.1"), ("--local-momentum", "1"),
                  ("--local-momentum", "0.1", "--local-opt", "dc"),
                  ("--local-momentum", "0.1", "--local-opt", "cadc"),
                  ("--cadc-lambda", "-1"), ("--cadc-m", "1.5")):
        with pytest.raises(ValueError, match=flags[0]):
            validate(cls, train_config("--algorithm", "odsgd", *flags), 2)
    with pytest.raises(SystemExit):
        train_config("--algorithm", "odsgd", "--cadc-args", "other")
    config = train_config("--algorithm", "odsgd", "--lr", "0.3")
    assert config.warmup_steps == 50 and config.lr_local is None and config.local_opt == "sgd"
    assert config.local_lookahead == "off"  # the paper's recurrence is the default
    # local momentum 0 (today's local step); CADCASGD's own defaults
    assert config.local_momentum == 0.0
    assert (config.cadc_lambda, config.cadc_m, config.cadc_args) == (2.0, 0.0, "named")


def test_lookahead_runs_are_labelled_as_the_variant():
    config = '{"local_lookahead": "on", "lr": 0.05}'
    assert run_label({"algorithm": "odsgd", "config": config}) == "odsgd+la"
    assert run_label({"algorithm": "odsgd", "config": {"local_lookahead": "on"}}) == "odsgd+la"
    assert run_label({"algorithm": "odsgd", "config": {"local_lookahead": "off"}}) == "odsgd"
    assert run_label({"algorithm": "odsgd"}) == "odsgd"  # older files: no such flag
    assert run_label({"algorithm": "ssgd", "config": {"local_lookahead": "on"}}) == "ssgd"
