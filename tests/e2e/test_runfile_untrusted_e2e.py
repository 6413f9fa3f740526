"""Run files from anyone: the reader takes nothing from outside the file: the tests that launch
jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_runfile_untrusted.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_runfile_untrusted import (
    CRAFTED,
    SECRET,
    _crafted,
    foreign,  # noqa: F401  (fixtures)
)


@pytest.mark.parametrize("craft", CRAFTED, ids=lambda c: c.__name__)
def test_report_prints_one_line_and_none_of_the_other_files_bytes(tmp_path, foreign, craft):
    path, said = _crafted(tmp_path, foreign, craft)
    for fmt in ("md", "json"):
        proc = subprocess.run([sys.executable, "-m", "syncbench", "report", str(path),
                               "--format", fmt], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"syncbench report: {path} is refused: ") and said in line
        assert "Traceback" not in proc.stderr
        assert SECRET.decode().strip() not in proc.stdout + proc.stderr
