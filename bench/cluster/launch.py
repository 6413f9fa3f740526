"""Launching across the emulated nodes with the venv's own MPI launcher.

Both launchers start their per-node agent through ``ssh``; here a shim stands
in for ``ssh`` (MPICH hydra's ``-launcher-exec``, Open MPI's
``plm_ssh_agent``): it drops ssh's options, maps the host to its node, puts
itself in the node's cgroups, and runs the agent's command inside the node's
network namespace with the node's hostname (``unshare --uts``) and clock
(``unshare --time --monotonic S``). ``-localhost <bridge address>`` tells
hydra where its proxies call back (the host name resolves to 127.0.0.1).

Traffic between nodes must cross the links: MPICH's UCX netmod otherwise
detects one machine and uses shared memory between the namespaces (almost
nothing crosses the veth), so ``UCX_TLS=tcp,self`` is set; ranks of one node
still use MPICH's own shared memory (hydra places them on one node). Open MPI
gets ``pml ob1`` with the ``tcp``, ``sm`` and ``self`` BTLs for the same
reason (its UCX PML would detect one machine). A variable the user already
set is left alone.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from syncbench.bench.experiment.launch import find_mpiexec

from .host import ClusterError
from .network import link_burst_bytes
from .state import Cluster, Node, check_file, load, state_dir, write_file

#: What makes inter-node traffic cross the links, per MPI flavour.
TRANSPORT_ENV = {
    "mpich": {"UCX_TLS": "tcp,self"},
    "openmpi": {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,sm,self",
                "OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_MCA_osc": "^ucx"},
}


def shim_path() -> Path:
    return state_dir() / "node-ssh"


def node_env(cluster: Cluster, node: Node) -> dict[str, str]:
    """What a rank on ``node`` learns of it from its launcher (the shim here, Slurm's
    TaskProlog): its quota's speed and bursts, and its link's token bucket; none of
    them where the node has no quota or an unshaped link."""
    env = {}
    if node.speed < 1:
        env["SYNCBENCH_NODE_SPEED"] = f"{node.speed:g}"
        if node.throttle:
            env["SYNCBENCH_NODE_THROTTLE"] = node.throttle
    burst = link_burst_bytes(node.link or cluster.link, cluster.burst)
    if burst > 0:
        env["SYNCBENCH_LINK_BURST"] = str(int(burst))
    return env


def shim_text(cluster: Cluster) -> str:
    """The ssh stand-in: ``node-ssh [ssh options] HOST COMMAND...``."""
    cases = []
    for n in cluster.nodes:
        procs = " ".join(n.cgroup_procs)
        offset = f"{n.clock_offset_s:g}"
        speed = "".join(f" export {k}={v};" for k, v in node_env(cluster, n).items())
        cases.append(f"  {n.address}|{n.name}|{n.name}.*) ns={n.name}; procs={shlex.quote(procs)}; "
                     f"offset={offset};{speed};")
    names = ", ".join(n.name for n in cluster.nodes)
    return "\n".join([
        "#!/bin/sh",
        "# syncbench emulated cluster: enter a node as ssh would (written by 'cluster up').",
        "while [ $# -gt 0 ]; do case \"$1\" in -o|-p|-l|-i|-F) shift 2;; --) shift; break;;",
        "  -*) shift;; *) break;; esac; done",
        'host=$1; shift',
        'case "$host" in',
        *cases,
        f'  *) echo "syncbench cluster: no node \'$host\' (nodes: {names})" >&2; exit 255;;',
        "esac",
        'for f in $procs; do echo $$ > "$f" || exit 255; done',
        'timens=""; [ "$offset" = 0 ] || timens="--time --monotonic $offset"',
        'exec ip netns exec "$ns" unshare --uts $timens sh -c "hostname $ns && $*"',
        "",
    ])


def write_shim(cluster: Cluster) -> Path:
    """Write ``node-ssh`` as a new file renamed into place: a launcher's ``sh`` that is
    reading the old one (sh reads a script as it runs it) reads it whole."""
    return write_file(cluster, "node-ssh", shim_text(cluster), 0o755)


def checked_shim() -> str:
    """``node-ssh``'s path, once it is a regular file of root's, mode 0755 or less (root
    executes it)."""
    return str(check_file(shim_path()))


def find_launcher() -> str:
    """The active venv's ``mpiexec`` (the one beside this Python), else ``$MPIEXEC``/PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return find_mpiexec()[0]


def mpi_flavour(mpiexec: str) -> str:
    """``mpich`` (hydra) or ``openmpi`` (prterun), from the launcher's ``--version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"cannot run {mpiexec} --version: {exc}") from exc
    if "HYDRA" in out or "MPICH" in out:
        return "mpich"
    if "Open MPI" in out or "prterun" in out or "PRRTE" in out:
        return "openmpi"
    raise ClusterError(f"{mpiexec} is neither MPICH's hydra nor Open MPI's launcher "
                       f"(--version said {out.strip().splitlines()[:1]})")


def placement(cluster: Cluster, ranks: int | None, ppn: int | None) -> tuple[int, int]:
    """(ranks, ranks per node): ``-n`` defaults to nodes x ppn, ppn to ceil(n / nodes)."""
    count = len(cluster.nodes)
    if ppn is not None and ppn < 1:
        raise ClusterError(f"--ppn must be at least 1, got {ppn}")
    if ranks is None:
        ppn = ppn or 1
        return count * ppn, ppn
    if ranks < 1:
        raise ClusterError(f"-n must be at least 1, got {ranks}")
    return ranks, ppn or -(-ranks // count)


def launch_command(cluster: Cluster, command: list[str], ranks: int | None = None,
                   ppn: int | None = None,
                   mpiexec: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The launcher's argument list and environment for ``command`` across the nodes."""
    if not command:
        raise ClusterError("no command to launch: syncbench cluster mpiexec -n N -- COMMAND")
    launcher = mpiexec or find_launcher()
    flavour = mpi_flavour(launcher)
    n, per_node = placement(cluster, ranks, ppn)
    used = cluster.nodes[:-(-n // per_node)]
    hosts = ",".join(f"{node.address}:{per_node}" for node in used)
    shim = checked_shim()
    env = dict(os.environ)
    for name, value in TRANSPORT_ENV[flavour].items():
        env.setdefault(name, value)
    if flavour == "mpich":
        args = [launcher, "-launcher", "ssh", "-launcher-exec", shim,
                "-localhost", cluster.bridge_address, "-hosts", hosts, "-n", str(n), *command]
    else:
        env["PRTE_MCA_plm_ssh_agent"] = shim
        # an explicit map: PRRTE's default policy with ":oversubscribe" packs node 1 first
        args = [launcher, "--host", hosts, "--map-by", f"ppr:{per_node}:node:oversubscribe",
                "-n", str(n), *command]
    return args, env


def node_command(cluster: Cluster, node_name: str, command: list[str]) -> list[str]:
    """``command`` run inside one node (its namespace, hostname, clock and cgroups)."""
    cluster.require_node(node_name)
    return [checked_shim(), node_name, shlex.join(command)]


def launcher_for_runs() -> str:
    """The ``--mpiexec`` string that launches a run across the cluster that is up
    (``syncbench run --cluster``, ``sweep --cluster``): this Python's ``syncbench
    cluster mpiexec``, which takes ``-n N COMMAND`` as ``mpiexec`` does."""
    if load() is None:
        raise ClusterError("--cluster: no emulated cluster is up (syncbench cluster up "
                           "--nodes N)")
    return f"{shlex.quote(sys.executable)} -m syncbench cluster mpiexec"
