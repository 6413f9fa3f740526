"""``analysis/output_paths.py``: an output path is refused before any work, in one line
naming the flag: a missing or unwritable folder, a folder where a file goes, a file that
exists without ``--overwrite``."""

from __future__ import annotations

import pytest

from syncbench.analysis.output_paths import (
    OutputError,
    check_new_file,
    check_output_dir,
    check_output_file,
)


def test_a_file_in_a_missing_folder_or_a_folder_is_refused(tmp_path):
    with pytest.raises(OutputError, match=r"^--out .*: directory .* does not exist$"):
        check_output_file("--out", tmp_path / "nowhere" / "x.h5")
    with pytest.raises(OutputError, match=r"^--out .* is a folder, not a file$"):
        check_output_file("--out", tmp_path)
    check_output_file("--out", tmp_path / "x.h5")  # a new file in a writable folder


def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path):
    path = tmp_path / "t.csv"
    check_new_file("--validate-csv", path, overwrite=False)
    path.write_text("kept\n")
    with pytest.raises(OutputError) as err:
        check_new_file("--validate-csv", path, overwrite=False)
    assert str(err.value) == f"--validate-csv {path} exists; pass --overwrite to replace it"
    check_new_file("--validate-csv", path, overwrite=True)
    assert path.read_text() == "kept\n"  # a check writes nothing


def test_a_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_output_dir("--out-dir", tmp_path / "file" / "sub")
