"""An emulated cluster of a test module's own (``syncbench cluster`` under its own name
prefix, subnet and state folder), the launchers to run on it, and its links' counters.

A module makes one :class:`TestCluster` and a module-scoped fixture ``with tc.up(...)``:
without root (or a tool or namespace the cluster needs) its tests skip, unless
``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OMPI_PY = REPO / ".venv-ompi" / "bin" / "python"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_osc": "^ucx"}


def launchers(with_transport: bool = False, slow_open_mpi: bool = False) -> list:
    """pytest params (python, env[, the transport variable it must record]) for MPICH
    and, where ``.venv-ompi`` exists, Open MPI (marked ``slow`` with ``slow_open_mpi``:
    ``make test-all`` only)."""
    mpich = (sys.executable, {}, "UCX_TLS")
    ompi = (str(OMPI_PY), OMPI_ENV, "OMPI_MCA_pml")
    cut = slice(None) if with_transport else slice(0, 2)
    return [pytest.param(*mpich[cut], id="mpich"),
            pytest.param(*ompi[cut], id="openmpi",
                         marks=[pytest.mark.skipif(not OMPI_PY.exists(),
                                                   reason="no .venv-ompi (make venv-openmpi)"),
                                *([pytest.mark.slow] if slow_open_mpi else [])])]


class TestCluster:
    """One test module's cluster: nodes ``<prefix>node1`` ... on ``<subnet>.0/24``."""

    __test__ = False  # not a test class

    def __init__(self, prefix: str, subnet: str, nodes: int = 2) -> None:
        self.prefix, self.subnet = prefix, subnet
        self.state_dir = Path(f"/run/syncbench-cluster-test-{prefix}-{os.getpid()}")
        self.nodes = [f"{prefix}node{i + 1}" for i in range(nodes)]
        self.env = {"SYNCBENCH_CLUSTER_PREFIX": prefix, "SYNCBENCH_CLUSTER_SUBNET": subnet,
                    "SYNCBENCH_CLUSTER_DIR": str(self.state_dir), "OMP_NUM_THREADS": "1"}
        self.state: dict = {}

    def syncbench(self, *args: str, python: str = sys.executable, env: dict | None = None,
                  timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``python -m syncbench ARGS`` with this cluster's names in the environment."""
        return subprocess.run([str(python), "-m", "syncbench", *args], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **self.env, **(env or {})})

    @staticmethod
    def why_not(time_namespaces: bool = False) -> str | None:
        """Why the cluster cannot come up here, or None."""
        if os.geteuid() != 0:
            return "the emulated cluster needs root"
        for tool in ("ip", "tc", "unshare"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        if subprocess.run(["unshare", "--uts", "true"]).returncode != 0:
            return "UTS namespaces are unavailable (unshare --uts)"
        if time_namespaces and \
                subprocess.run(["unshare", "--time", "--monotonic", "1", "true"]).returncode:
            return "time namespaces are unavailable (unshare --time)"
        return None

    @classmethod
    def require(cls, time_namespaces: bool = False) -> None:
        """Skip (or, under ``SYNCBENCH_REQUIRE_CLUSTER=1``, fail) where no cluster can be
        made here."""
        reason = cls.why_not(time_namespaces)
        if reason:
            if os.environ.get("SYNCBENCH_REQUIRE_CLUSTER") == "1":
                pytest.fail(f"SYNCBENCH_REQUIRE_CLUSTER=1 but {reason}")
            pytest.skip(reason)

    def leftovers(self) -> list[str]:
        """This prefix's namespaces, links and node cgroups that exist now."""
        found = [f"netns {p.name}" for p in Path("/run/netns").glob(f"{self.prefix}*")]
        found += [f"link {p.name}" for p in Path("/sys/class/net").glob(f"{self.prefix}*")]
        root = Path("/sys/fs/cgroup")
        for node in self.nodes:
            found += [f"cgroup {p}" for p in (root / node, *root.glob(f"*/{node}")) if p.is_dir()]
        return found

    @contextlib.contextmanager
    def up(self, *flags: str, time_namespaces: bool = False) -> Iterator[dict]:
        """Bring the cluster up (or skip), yield its state file, take it down and check
        that its namespaces, links and cgroups are gone."""
        self.require(time_namespaces)
        started = self.syncbench("cluster", "up", "--nodes", str(len(self.nodes)), *flags)
        try:
            assert started.returncode == 0, started.stdout + started.stderr
            self.state = json.loads((self.state_dir / "state.json").read_text())
            yield self.state
        finally:
            down = self.syncbench("cluster", "down")
            assert down.returncode == 0, down.stderr
            assert self.leftovers() == []

    def link_bytes(self) -> list[tuple[int, int]]:
        """(rx, tx) bytes of each node's host-side veth so far (rx: what the node sent)."""
        out = []
        for node in self.state["nodes"]:
            base = Path("/sys/class/net", node["veth"], "statistics")
            out.append((int((base / "rx_bytes").read_text()),
                        int((base / "tx_bytes").read_text())))
        return out
