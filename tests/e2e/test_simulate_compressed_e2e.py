"""``syncbench simulate --compress`` and DiLoCo's flags on the command line: bad input is
one line and status 2, checked as ``train`` checks the same flags."""

from __future__ import annotations

from sim_helpers import needs_simgrid, simulate


@needs_simgrid
def test_bad_compress_flag_is_one_line_and_status_2():
    for flags in (["--compress", "topk"], ["--compress", "powersgd:2"],
                  ["--algorithm", "diloco", "--fragments", "9", "--inner-steps", "10"]):
        proc = simulate("--np", "4", "--steps", "1", *flags, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (flags, proc.stderr)
        assert lines[0].startswith("syncbench simulate: error:"), flags
