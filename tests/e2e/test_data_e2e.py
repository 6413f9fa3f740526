"""Datasets: IDX/CIFAR readers and validation, look-up, loading, synthetic data, fetching.

Split off ``tests/unit/test_data.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import shutil

import pytest
from test_data import assert_one_line_error, make_mnist_dir

from syncbench.bench.data import catalog
from syncbench.bench.data.dataset import DatasetError


@pytest.fixture(autouse=True)
def isolated_lookup(monkeypatch, tmp_path):
    """No $SYNCBENCH_DATA and an empty system root unless a test sets them."""
    monkeypatch.delenv("SYNCBENCH_DATA", raising=False)
    empty = tmp_path / "system-root"
    empty.mkdir()
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", empty)


def test_system_root_used_last(tmp_path, monkeypatch):
    system = tmp_path / "sys"
    make_mnist_dir(system / "mnist", n_train=3)
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", system)
    assert catalog.find_dataset_dir("mnist") == system / "mnist"
    # Files directly in the system root are not a dataset (only <root>/<name> is).
    shutil.rmtree(system / "mnist")
    make_mnist_dir(system, n_train=3)
    with pytest.raises(DatasetError) as exc:
        catalog.find_dataset_dir("mnist")
    assert_one_line_error(exc, "not found")
