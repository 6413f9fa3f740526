"""The micro-benchmarks of MPI progress (``bench/micro/polls.py``, ``rma_behind.py``) on 2
ranks of this host over TCP (``UCX_TLS=tcp,self``, ``MPIR_CVAR_NOLOCAL=1``: no shared
memory, so a target serves only inside MPI calls, as across the emulated cluster's nodes)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import MPIEXEC

TCP = {"UCX_TLS": "tcp,self", "MPIR_CVAR_NOLOCAL": "1", "OMP_NUM_THREADS": "1"}


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m",
                           f"syncbench.bench.micro.{module}", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **TCP})


@pytest.mark.alone  # ranks that spin between polls: not beside another test worker
def test_an_accumulate_to_a_busy_target_takes_more_of_its_polls_the_larger_it_is():
    """One host, polls 2 ms apart: 16 KB is served at the first poll (about half a gap),
    155 KB needs several (measured here 4.9 gaps; across the emulated cluster 2.7)."""
    done = _run("polls", "--op", "accumulate", "--gap-ms", "2", "--sizes", "16384,158720")
    assert done.returncode == 0, done.stderr
    gaps = [float(m) for m in re.findall(r", ([0-9.]+) gaps$", done.stdout, re.M)]
    assert len(gaps) == 2
    assert gaps[0] < 1.0 and gaps[1] > gaps[0] + 1.0


@pytest.mark.alone  # ranks that spin between polls: not beside another test worker
def test_a_nonblocking_allreduce_between_busy_ranks_takes_a_poll_per_segment():
    """Both ranks polling 1 ms apart: 16 KB completes in a few polls, 470 KB needs about
    one more per 64 KiB (measured across the emulated cluster: 3 and 7-9 gaps more)."""
    done = _run("polls", "--op", "iallreduce", "--gap-ms", "1", "--sizes", "16384,470000")
    assert done.returncode == 0, done.stderr
    gaps = [float(m) for m in re.findall(r", ([0-9.]+) gaps$", done.stdout, re.M)]
    assert len(gaps) == 2 and gaps[1] > gaps[0] + 3.0


@pytest.mark.alone  # ranks that spin between polls: not beside another test worker
def test_a_small_round_trip_waits_behind_the_accumulates_on_its_connection():
    done = _run("rma_behind", "--bytes", "470000", "--seconds", "1")
    assert done.returncode == 0, done.stderr
    found = re.findall(r"^\s*(idle|pushing) .* round trip ([0-9.]+) ms \(p10 ([0-9.]+)",
                       done.stdout, re.M)
    trips = {kind: (float(median), float(p10)) for kind, median, p10 in found}
    assert set(trips) == {"idle", "pushing"}
    # the idle trips' 10th percentile: a trip the host's other work did not delay
    # (here about 0.02 ms idle, 0.2-0.3 ms at the median behind the pushes)
    assert trips["pushing"][0] > 3 * trips["idle"][1]


@pytest.mark.parametrize("module,flags,line", [
    ("polls", ["--gap-ms", "0"],
     "polls: give --gap-ms > 0 and --sizes as comma-separated bytes, each >= 4"),
    ("polls", ["--sizes", "1,x"],
     "polls: give --gap-ms > 0 and --sizes as comma-separated bytes, each >= 4"),
    ("polls", ["--what"], "polls: unknown arguments: --what"),
    ("rma_behind", ["--seconds", "inf"], "rma_behind: give --bytes >= 4 and --seconds > 0"),
    ("rma_behind", ["--bytes", "2"], "rma_behind: give --bytes >= 4 and --seconds > 0"),
    ("rma_behind", ["--behind", "gets"], "rma_behind: --behind 'gets': give pushes or replies"),
])
def test_the_rma_micro_benchmarks_bad_input_is_one_line(capsys, module, flags, line):
    import importlib

    main = importlib.import_module(f"syncbench.bench.micro.{module}").main
    assert main(flags) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


RANGES = ("after_idle: give --sizes of 4 bytes to 64 MiB, --gap-ms in (0, 10000] and "
          "--repeats of 10 to 100000")


@pytest.mark.parametrize("flags,line", [
    (["--op", "bcast"], "after_idle: --op bcast: give allreduce or allgather, or both "
                        "comma-separated"),
    (["--op", "allreduce,allreduce"], "after_idle: --op allreduce,allreduce: give allreduce "
                                      "or allgather, or both comma-separated"),
    (["--model", "vgg"], "after_idle: --model: unknown model 'vgg'; choose one of mlp, lenet, "
                         "resnet8, resnet20, mlp:H1,H2,... or gpt:d=N,layers=N,heads=N,ctx=N"),
    (["--batch-size", "0"], "after_idle: give --batch-size of 1 to 65536"),
    (["--out", "x.txt"], "after_idle: --out x.txt: name it *.json"),
    (["--sizes", "2"], RANGES),
    (["--sizes", "3072,"], RANGES),
    (["--sizes", str(1 << 30)], RANGES),
    (["--gap-ms", "nan"], RANGES),
    (["--gap-ms", "0"], RANGES),
    (["--gap-ms", "-1"], RANGES),
    (["--repeats", "x"], RANGES),
    (["--repeats", "5"], RANGES),
    (["--sizes", "4098"], "after_idle: an allreduce sums float32: give --sizes in multiples "
                          "of 4 bytes"),
])
def test_the_short_collective_benchmarks_bad_input_is_one_line(capsys, flags, line):
    from syncbench.bench.micro.after_idle import main

    assert main(flags) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]

