"""Compile every CUDA source with NVRTC or ``nvcc -ptx``; exit non-zero on any error (CI).

Each ``kernels/cuda/*.cu`` is built twice, as the GPU path builds it
(:func:`syncbench.kernels.cuda_launch.compile_options` plus the options CuPy
adds): ``-DSB_REAL=float`` and ``-DSB_REAL=double``, with ``--fmad=false``
and ``-ftz=true``. No GPU is needed.

Compilers (``--compiler``):

* ``nvrtc``: the NVRTC library through ``ctypes``. It is looked up in the
  ``nvidia-cuda-nvrtc-cu12`` wheel (``site-packages/nvidia/cuda_nvrtc/lib/
  libnvrtc.so.12``; also the CUDA 13 wheels' ``nvidia/cu13/lib``), then
  ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda``, and the loader's path.
  ``$SYNCBENCH_NVRTC`` names the library file explicitly.
* ``nvcc``: ``nvcc -ptx`` when ``nvcc`` is on ``PATH``.
* ``host``: the same sources as C++ with ``g++`` (a prelude defines
  ``__global__``, ``threadIdx``...), the build :class:`HostEmulator` runs.
* ``auto`` (default): NVRTC if found, else nvcc; ``all``: every one found.

Besides the portable PTX, each source is built to machine code for every
``--arch`` (default ``sm_90``, the H100/H200; ``--arch none`` skips it):
NVRTC with ``--gpu-architecture=sm_90`` (a CUBIN, no GPU needed), and
``nvcc -cubin -arch=sm_90`` whenever ``nvcc`` is on ``PATH`` (with any
``--compiler`` but ``host``), so ptxas checks the kernels for that chip
(registers, instructions), which PTX alone does not. Builds run in parallel.

Exit status: 0 all built, 1 a source failed (its compiler log is printed),
2 no requested compiler is available.

:class:`HostEmulator` is a launcher (:mod:`syncbench.kernels.cuda_launch`)
that runs a kernel on the CPU: every (block, thread) of the grid in turn,
with NumPy arrays as device memory. The loop over the grid is C++ too (a
``sb_run_<kernel>`` wrapper generated from each kernel's signature), so the
emulator can run the kernels at benchmark sizes. It is exact for these kernels because
none uses shared memory, barriers or atomics, and each output element is
written by one thread. It checks every argument against the kernel's C
signature (the dtype of each scalar included), as a GPU would not.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from syncbench.kernels.cuda_launch import (
    CUPY_ADDED_OPTIONS,
    KERNEL_DIR,
    REAL_CTYPES,
    KernelSignature,
    compile_options,
    kernel_signatures,
    module_source,
    parse_signatures,
    source_files,
)

COMPILERS = ("auto", "nvrtc", "nvcc", "host", "all")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: Machine-code targets built besides the PTX (``--arch``): the H100/H200 (Hopper).
DEFAULT_ARCHS: tuple[str, ...] = ("sm_90",)


@dataclass
class BuildResult:
    """One source built by one compiler for one dtype (and one ``arch``: machine code)."""

    source: Path
    compiler: str
    dtype: np.dtype
    ok: bool
    log: str
    arch: str = ""

    @property
    def label(self) -> str:
        """``nvrtc``, ``nvcc:sm_90``...: the compiler, and the target of a machine-code build."""
        return f"{self.compiler}:{self.arch}" if self.arch else self.compiler


# -- NVRTC through ctypes ---------------------------------------------------------------
def _site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and path not in dirs:
            dirs.append(path)
    return dirs


def nvrtc_candidates(ld_cache: bool = True) -> list[str]:
    """Paths or sonames where libnvrtc may be, most specific first (``ld_cache=False``:
    without the linker cache's answer, which runs ``ldconfig -p``)."""
    found: list[str] = []
    explicit = os.environ.get("SYNCBENCH_NVRTC")
    if explicit:
        found.append(explicit)
    for site in _site_dirs():  # pip wheels: nvidia-cuda-nvrtc-cu12, CUDA 13 layout
        for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu*/lib/libnvrtc.so*"):
            found += sorted(glob.glob(os.path.join(site, pattern)), reverse=True)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found += sorted(glob.glob(os.path.join(os.environ[var], "lib*", "libnvrtc.so*")))
    found += sorted(glob.glob("/usr/local/cuda*/lib*/libnvrtc.so*"), reverse=True)
    name = ctypes.util.find_library("nvrtc") if ld_cache else None
    found += [name] if name else []
    found += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    return [f for f in dict.fromkeys(found) if "builtins" not in os.path.basename(f)
            and ".alt." not in os.path.basename(f)]


@functools.lru_cache(maxsize=1)
def load_nvrtc() -> ctypes.CDLL | None:
    """The first NVRTC library that loads, or None (the linker cache is asked only when
    no wheel or CUDA folder has one)."""
    tried: set[str] = set()
    for candidate in (c for search in (False, True) for c in nvrtc_candidates(ld_cache=search)):
        if candidate in tried:
            continue
        tried.add(candidate)
        try:
            lib = ctypes.CDLL(candidate)
            lib.nvrtcVersion  # noqa: B018 - raises AttributeError if not NVRTC
        except (OSError, AttributeError):
            continue
        lib._syncbench_path = candidate  # type: ignore[attr-defined]
        return lib
    return None


def nvrtc_version(lib: ctypes.CDLL) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_nvrtc(text: str, name: str, options: tuple[str, ...],
                  arch: str = "") -> tuple[bool, str]:
    """Compile ``text`` to PTX with NVRTC, or to a CUBIN for ``arch`` (``sm_90``); returns
    (ok, log)."""
    lib = load_nvrtc()
    if lib is None:
        raise RuntimeError("NVRTC not found")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0,
                                    None, None)
    if status:
        return False, f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(status).decode()}"
    if arch:
        options = (*options, f"--gpu-architecture={arch}")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if status:
            return False, f"{lib.nvrtcGetErrorString(status).decode()}\n{log}".strip()
        size_of, what = (lib.nvrtcGetCUBINSize, f"{arch} CUBIN") if arch \
            else (lib.nvrtcGetPTXSize, "PTX")
        out_size = ctypes.c_size_t()
        status = size_of(prog, ctypes.byref(out_size))
        if status or out_size.value <= 1:
            return False, f"NVRTC produced no {what}\n{log}".strip()
        return True, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


# -- nvcc and g++ --------------------------------------------------------------------------
def nvcc_command(path: Path, options: tuple[str, ...], output: str,
                 arch: str = "") -> list[str]:
    """``nvcc -ptx`` of ``path`` (portable PTX, no target), or ``nvcc -cubin -arch=<arch>``
    (machine code for that chip: ptxas runs too)."""
    target = ["-cubin", f"-arch={arch}"] if arch else ["-ptx"]
    return ["nvcc", *target, *options, "-o", output, str(path)]


def compile_nvcc(path: Path, options: tuple[str, ...], arch: str = "") -> tuple[bool, str]:
    """:func:`nvcc_command` of ``path``; returns (ok, log)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = nvcc_command(path, options, os.path.join(tmp, "out.cubin" if arch else "out.ptx"),
                           arch)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


#: Makes a kernel source valid C++: CUDA qualifiers vanish and the thread
#: coordinates become globals that the emulator sets before each call.
HOST_PRELUDE = r"""
#include <math.h>
struct sb_dim3 { unsigned int x, y, z; };
extern "C" { sb_dim3 threadIdx, blockIdx, blockDim, gridDim; }
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
"""


def grid_wrappers(path: Path, signatures: dict[str, KernelSignature]) -> str:
    """C++ that includes ``path`` and adds, per kernel ``k``, ``sb_run_k(grid, block, ...)``:
    the loop over every (block, thread) of a 1-D grid, calling ``k`` with the same arguments."""
    lines = [f'#include "{path}"']
    for name, signature in signatures.items():
        params = [f"{ptype} a{i}" for i, ptype in enumerate(signature.params)]
        args = ", ".join(f"a{i}" for i in range(len(params)))
        lines += [
            f'extern "C" void sb_run_{name}(unsigned grid, unsigned block, {", ".join(params)}) {{',
            "    blockDim.x = block; gridDim.x = grid;",
            "    for (unsigned b = 0; b < grid; ++b) {",
            "        blockIdx.x = b;",
            f"        for (unsigned t = 0; t < block; ++t) {{ threadIdx.x = t; {name}({args}); }}",
            "    }",
            "}",
        ]
    return "\n".join(lines) + "\n"


def host_command(path: Path, dtype: np.dtype, output: str, prelude: str) -> list[str]:
    """The g++ command that builds ``path`` as a shared library for the emulator."""
    return ["g++", "-std=c++14", "-O1", "-fPIC", "-shared", "-ffp-contract=off",
            "-fno-fast-math", "-Wall", "-Werror", "-Wno-unused-function",
            f"-DSB_REAL={REAL_CTYPES[dtype]}", "-include", prelude, "-x", "c++", str(path),
            "-o", output]


def compile_host(path: Path, dtype: np.dtype, output: str | None = None) -> tuple[bool, str]:
    """Build ``path`` as C++ with g++ (to ``output``, else to a scratch file)."""
    with tempfile.TemporaryDirectory() as tmp:
        prelude = os.path.join(tmp, "sb_host_prelude.h")
        Path(prelude).write_text(HOST_PRELUDE)
        target = output or os.path.join(tmp, "out.so")
        proc = subprocess.run(host_command(path, dtype, target, prelude), capture_output=True,
                              text=True, timeout=300)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def available_compilers() -> list[str]:
    """Which of nvrtc, nvcc, host can run here."""
    found = []
    if load_nvrtc() is not None:
        found.append("nvrtc")
    if shutil.which("nvcc"):
        found.append("nvcc")
    if shutil.which("g++"):
        found.append("host")
    return found


def resolve_compilers(choice: str) -> list[str]:
    """The compilers ``--compiler choice`` means on this machine (empty: none available)."""
    available = available_compilers()
    if choice == "all":
        return available
    if choice == "auto":
        gpu = [c for c in ("nvrtc", "nvcc") if c in available]
        return gpu[:1]
    return [choice] if choice in available else []


def build(path: Path, compiler: str, dtype: np.dtype, arch: str = "") -> BuildResult:
    """Build one source with one compiler for one dtype (machine code for ``arch``)."""
    options = compile_options(dtype)
    if compiler == "nvrtc":
        text = module_source(path.stem, path.parent)  # what CupyLauncher compiles
        ok, log = compile_nvrtc(text, path.name, options + CUPY_ADDED_OPTIONS, arch)
    elif compiler == "nvcc":
        ok, log = compile_nvcc(path, (*options, "-ftz=true"), arch)
    else:
        ok, log = compile_host(path, dtype)
    if ok and not parse_signatures(path.read_text(), path.stem):
        ok, log = False, f"no extern \"C\" __global__ kernel found\n{log}".strip()
    return BuildResult(path, compiler, dtype, ok, log, arch)


def arch_builds(compilers: list[str], archs: tuple[str, ...],
                nvcc_found: bool | None = None) -> list[tuple[str, str]]:
    """The ``(compiler, arch)`` machine-code builds: every arch with NVRTC when it is among
    ``compilers``, and with nvcc when it is or ``nvcc`` is on ``PATH`` (``nvcc_found``),
    unless only the host build was asked for."""
    if not archs or compilers == ["host"]:
        return []
    found = shutil.which("nvcc") is not None if nvcc_found is None else nvcc_found
    gpu = [c for c in ("nvrtc", "nvcc") if c in compilers or (c == "nvcc" and found)]
    return [(compiler, arch) for compiler in gpu for arch in archs]


def check(sources: list[Path], compilers: list[str],
          archs: tuple[str, ...] = ()) -> list[BuildResult]:
    """Build every source with every compiler (and every arch: :func:`arch_builds`), for
    float and double, in parallel; results in that order."""
    jobs = [(path, compiler, dtype, "") for path in sources for compiler in compilers
            for dtype in DTYPES]
    jobs += [(path, compiler, dtype, arch) for path in sources
             for compiler, arch in arch_builds(compilers, archs) for dtype in DTYPES]
    if "nvrtc" in compilers or any(job[1] == "nvrtc" for job in jobs):
        load_nvrtc()  # once, before the threads
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda job: build(*job), jobs))


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m syncbench.kernels.compile_check [--compiler C] [FILE.cu ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m syncbench.kernels.compile_check",
        description="Compile the CUDA kernel sources (no GPU needed); non-zero exit on error.")
    parser.add_argument("sources", nargs="*", type=Path,
                        help="sources to check (default: every kernels/cuda/*.cu)")
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="auto: NVRTC, else nvcc; all: every available, g++ included")
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHS),
                        help="machine-code targets besides the PTX, comma-separated (NVRTC, "
                        "and nvcc when on PATH); 'none' for PTX only (default: %(default)s)")
    config = parser.parse_args(argv)
    archs = tuple(a.strip() for a in config.arch.split(",")
                  if a.strip() and a.strip() != "none")
    sources = config.sources or source_files()
    missing = [s for s in sources if not s.is_file()]
    if missing or not sources:
        print(f"compile_check: no such source: {', '.join(map(str, missing)) or '(none)'}",
              file=sys.stderr)
        return 2
    compilers = resolve_compilers(config.compiler)
    if not compilers:
        print(f"compile_check: no compiler for --compiler {config.compiler}: install NVRTC "
              "(pip install nvidia-cuda-nvrtc-cu12) or put nvcc on PATH", file=sys.stderr)
        return 2
    lib = load_nvrtc()
    if "nvrtc" in compilers and lib is not None:
        major, minor = nvrtc_version(lib)
        print(f"nvrtc {major}.{minor}: {lib._syncbench_path}")  # type: ignore[attr-defined]
    failures = 0
    results = check(sources, compilers, archs)
    for result in results:
        status = "ok" if result.ok else "FAILED"
        print(f"{status:<6} {result.label:<11} {result.dtype.name:<7} {result.source}")
        if result.log and (not result.ok or result.compiler != "host"):
            print("  " + result.log.replace("\n", "\n  "))
        failures += not result.ok
    labels = list(dict.fromkeys(r.label for r in results))
    print(f"compile_check: {len(sources)} sources x {len(labels)} builds "
          f"({', '.join(labels)}) x 2 dtypes, {failures} failed")
    return 1 if failures else 0


# -- the host emulator -----------------------------------------------------------------------
_SCALARS = {
    "long long": (np.int64, ctypes.c_longlong),
    "int": (np.int32, ctypes.c_int),
}
_POINTEES = {"long long": np.int64, "int": np.int32}


class HostEmulator:
    """A :class:`syncbench.kernels.cuda_launch.Launcher` that runs kernels on the CPU.

    ``max_blocks`` caps the grid (e.g. 1) so the kernels' grid-stride loops
    are exercised; the result must not change.
    """

    #: Built libraries, shared by every emulator of the process: (source, dtype) -> CDLL.
    _libs: dict[tuple[str, np.dtype], ctypes.CDLL] = {}
    _tmp: tempfile.TemporaryDirectory | None = None

    def __init__(self, max_blocks: int | None = None, block: int | None = None) -> None:
        self.max_blocks, self.block = max_blocks, block
        self.launches: list[tuple[str, int, int]] = []

    @classmethod
    def library(cls, source: str, dtype: np.dtype) -> ctypes.CDLL:
        """``source``.cu built with g++ for ``dtype`` (once per process)."""
        key = (source, np.dtype(dtype))
        if key not in cls._libs:
            if cls._tmp is None:
                cls._tmp = tempfile.TemporaryDirectory(prefix="syncbench-emu-")
            prelude = os.path.join(cls._tmp.name, "sb_host_prelude.h")
            Path(prelude).write_text(HOST_PRELUDE)
            output = os.path.join(cls._tmp.name, f"{source}_{key[1].name}.so")
            path = KERNEL_DIR / f"{source}.cu"
            wrapped = Path(cls._tmp.name) / f"{source}_grid.cpp"
            wrapped.write_text(grid_wrappers(path, parse_signatures(path.read_text(), source)))
            proc = subprocess.run(host_command(wrapped, key[1], output, prelude),
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode:
                raise RuntimeError(f"g++ failed on {path}:\n{proc.stderr}")
            cls._libs[key] = ctypes.CDLL(output)
        return cls._libs[key]

    def _convert(self, kernel: str, dtype: np.dtype, params: tuple[str, ...],
                 args: tuple) -> tuple[list[Any], list[Any]]:
        if len(args) != len(params):
            raise TypeError(f"{kernel}: {len(args)} arguments for {len(params)} parameters")
        argtypes, values = [], []
        real_ctype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
        for i, (ptype, arg) in enumerate(zip(params, args)):
            where = f"{kernel} argument {i} ({ptype})"
            if ptype.endswith("*"):
                base = ptype[:-1]
                want = dtype if base == "real" else np.dtype(_POINTEES[base])
                if not isinstance(arg, np.ndarray) or arg.dtype != want:
                    raise TypeError(f"{where}: expected a {want} array, got {type(arg)} "
                                    f"{getattr(arg, 'dtype', '')}")
                if not arg.flags.c_contiguous:
                    raise TypeError(f"{where}: array is not C-contiguous")
                argtypes.append(ctypes.c_void_p)
                values.append(arg.ctypes.data)
            else:
                want_type, ctype = (dtype.type, real_ctype) if ptype == "real" \
                    else _SCALARS[ptype]
                if type(arg) is not want_type:
                    raise TypeError(f"{where}: expected {want_type.__name__}, got "
                                    f"{type(arg).__name__} (CuPy would pass its raw bytes)")
                argtypes.append(ctype)
                values.append(ctype(arg.item()))
        return argtypes, values

    def __call__(self, source: str, kernel: str, dtype: np.dtype, grid: int, block: int,
                 args: tuple) -> None:
        signature = kernel_signatures()[kernel]
        if signature.source != source:
            raise ValueError(f"{kernel} lives in {signature.source}.cu, not {source}.cu")
        lib = self.library(source, np.dtype(dtype))
        fn = getattr(lib, f"sb_run_{kernel}")
        argtypes, values = self._convert(kernel, np.dtype(dtype), signature.params, args)
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, *argtypes]
        fn.restype = None
        grid = min(grid, self.max_blocks) if self.max_blocks else grid
        block = self.block or block
        self.launches.append((kernel, grid, block))
        fn(grid, block, *values)


if __name__ == "__main__":
    raise SystemExit(main())
