"""``syncbench data info|fetch NAME``: where a dataset is found, or download it.

``info`` loads the dataset exactly as ``train`` would (same look-up order:
``--data-dir``, ``$SYNCBENCH_DATA``, ``/usr/share/datasets/<name>``) and
prints its shapes and source; ``fetch`` downloads the official files into
``--dest`` and verifies their MD5 sums (needs internet).
"""

from __future__ import annotations

import argparse
import sys

from syncbench.bench.data.catalog import DATASETS, DatasetError, load_dataset
from syncbench.bench.data.fetch import fetch_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("info", "fetch"))
    parser.add_argument("name", choices=DATASETS)
    parser.add_argument("--data-dir", default=None, help="for info: where to look first")
    parser.add_argument("--dest", default=".", help="for fetch: target directory")


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "fetch":
            for path in fetch_dataset(args.name, args.dest):
                print(path)
        else:
            ds = load_dataset(args.name, args.data_dir)
            print(f"{ds.name}: train {ds.train_x.shape} test {ds.test_x.shape} "
                  f"classes {ds.num_classes} from {ds.source}")
    except DatasetError as exc:
        print(f"syncbench data: {exc}", file=sys.stderr)
        return 2
    return 0
