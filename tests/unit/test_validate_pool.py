"""``simulate --validate-csv`` and ``--validate-pool``: each run's row kept, and the
validation pooled over several sets (bench/simulate/validate_pool.py)."""

from __future__ import annotations

import argparse
import math

import pytest
from validation_rows import rows_of

from syncbench.bench.simulate.validate_pool import (
    COLUMNS,
    ValidationRow,
    pool,
    pool_main,
    read_table,
    write_table,
)


def test_a_table_round_trips_through_its_file(tmp_path):
    rows = rows_of("a", {("ssgd", "hom"): [0.1, -0.05], ("topk", "work 2x"): [-0.2]})
    path = tmp_path / "a.csv"
    write_table(str(path), rows)
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    back = read_table(str(path))
    assert [(r.run, r.model, r.label, r.configuration) for r in back] == \
        [(r.run, r.model, r.label, r.configuration) for r in rows]
    assert [r.error for r in back] == pytest.approx([0.1, -0.05, -0.2])
    assert [r.link for r in back] == pytest.approx([1.2e8] * 3)


def test_pooling_takes_every_repeat_and_judges_each_set_on_its_own():
    """topk is off in both sets with one sign: the model's bias. ssgd is off in one set
    only: pooled with the other set's repeats it is within the limit."""
    a = rows_of("a", {("topk", "hom"): [-0.20, -0.24], ("ssgd", "hom"): [0.30, 0.10]})
    b = rows_of("b", {("topk", "hom"): [-0.18, -0.22], ("ssgd", "hom"): [0.0, -0.04]})
    by_key = {c.key: c for c in pool([a, b])}
    topk, ssgd = by_key["mlp", "topk", "hom"], by_key["mlp", "ssgd", "hom"]
    logs = [math.log1p(e) for e in (-0.20, -0.24, -0.18, -0.22)]
    assert topk.error == pytest.approx(math.expm1(sum(logs) / 4))
    assert topk.repeats == 4 and topk.sets_off == 2 and topk.one_sign
    assert ssgd.sets_off == 1 and abs(ssgd.error) < 0.15
    assert ssgd.set_errors[1] == pytest.approx(math.expm1((math.log(1.0) + math.log(0.96)) / 2))


def test_the_pooled_table_names_the_configurations_off_in_every_set(tmp_path, capsys):
    paths = []
    for name, errs in (("a", [-0.20, -0.24]), ("b", [-0.18, -0.22])):
        path = tmp_path / f"{name}.csv"
        write_table(str(path), rows_of(name, {("topk", "hom"): errs,
                                              ("ssgd", "hom"): [0.01, 0.02]}))
        paths.append(str(path))
    assert pool_main(argparse.Namespace(validate_pool=paths)) == 0
    out = capsys.readouterr().out
    assert "8 runs from 2 tables" in out
    assert "* off by more than 15%: 1 of 2 configurations" in out
    assert "0 set(s): 1, 2 set(s): 1" in out
    verdicts = out.split("each set (* off)")[1].splitlines()[1:]
    assert len(verdicts) == 1  # ssgd, within the limit in both sets, is not listed
    assert verdicts[0].split() == ["mlp", "topk", "hom", "-21%", "4", "-22%*", "-20%*",
                                   "off", "in", "every", "set,", "one", "sign"]


def test_a_row_without_a_rate_is_left_out_and_counted(tmp_path, capsys):
    rows = rows_of("a", {("ssgd", "hom"): [0.02, 0.04]})
    rows.append(ValidationRow("/a/broken.h5", "mlp", "ssgd", "hom", math.nan, 1000.0, 1.2e8))
    write_table(str(tmp_path / "a.csv"), rows)
    assert pool_main(argparse.Namespace(validate_pool=[str(tmp_path / "a.csv")])) == 0
    out = capsys.readouterr().out
    assert "2 runs from 1 tables; 1 row(s) without a positive measured and predicted " \
        "rate left out" in out
    assert "nan" not in out.lower()


def test_tables_of_two_link_rates_are_refused(tmp_path):
    write_table(str(tmp_path / "fast.csv"), rows_of("a", {("ssgd", "hom"): [0.0]}, 1.2e8))
    write_table(str(tmp_path / "slow.csv"), rows_of("b", {("ssgd", "hom"): [0.0]}, 2.4e7))
    write_table(str(tmp_path / "fast2.csv"), rows_of("c", {("ssgd", "hom"): [0.0]}, 1.1e8))
    args = argparse.Namespace(validate_pool=[str(tmp_path / n)
                                             for n in ("fast.csv", "fast2.csv", "slow.csv")])
    with pytest.raises(ValueError, match=r"slow.csv was predicted on a link of 24 MB/s and "
                                         r".*fast.csv on one of 120 MB/s"):
        pool_main(args)
    args.validate_pool = args.validate_pool[:2]  # two calibrations of one link pool
    assert pool_main(args) == 0


def test_one_sign_needs_every_error_on_one_side_of_zero():
    from syncbench.bench.simulate.validate_pool import PooledConfig

    assert PooledConfig(("m", "l", "c"), -0.2, 4, (-0.2, -0.3), 0.15).one_sign
    assert not PooledConfig(("m", "l", "c"), -0.2, 4, (-0.2, 0.0), 0.15).one_sign
    assert not PooledConfig(("m", "l", "c"), math.nan, 4, (-0.2, math.nan), 0.15).one_sign
    assert PooledConfig(("m", "l", "c"), math.nan, 4, (-0.2, math.nan), 0.15).sets_off == 1


def test_an_unwritable_or_existing_validate_csv_is_refused_before_anything_is_read(tmp_path):
    from syncbench.bench.simulate.validate import check_table_path, validate_main

    args = argparse.Namespace(validate_csv=str(tmp_path / "no" / "t.csv"), overwrite=False,
                              validate=[str(tmp_path / "missing.h5")])
    with pytest.raises(ValueError, match="--validate-csv .*not writable"):
        validate_main(args)  # before the missing run file is read
    args.validate_csv = str(tmp_path)
    with pytest.raises(ValueError, match="--validate-csv .* is a folder"):
        check_table_path(args)
    (tmp_path / "t.csv").write_text("kept")
    args.validate_csv = str(tmp_path / "t.csv")
    with pytest.raises(ValueError, match="t.csv exists; pass --overwrite"):
        check_table_path(args)
    args.overwrite = True
    assert check_table_path(args) == str(tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text() == "kept"
