"""The emulated nodes as Slurm nodes: one ``slurmd`` per node, partition ``emulated``.

``up --slurm`` appends the nodes (``NodeName=sbnode1 NodeAddr=10.77.0.1 ...``)
and the partition to the local cluster's ``slurm.conf`` through
``jobs/slurm/local-cluster.sh`` (``SLURM_EXTRA_CONF``), with slurmctld reached
at the bridge's address (``SLURM_CTLD_ADDR``: 127.0.0.1 inside a node is the
node's own loopback), then starts each node's ``slurmd -N NODE`` inside it,
through the launcher shim (its namespace, hostname, clock and cgroups: the
node's jobs inherit them). slurmd 22.05 exits with "No filesystem mounted on
/sys/fs/cgroup" where ``ip netns exec`` has mounted the node's own ``/sys``,
so the node's mount namespace gets a tmpfs there and the host's cgroup
hierarchies mounted again. A ``TaskProlog`` exports the transport settings
of :data:`~.launch.TRANSPORT_ENV` into tasks on the emulated nodes (unless
the job set them), which is how a site sets its network for every job.
``down`` stops the node daemons and rewrites ``slurm.conf`` without them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .host import ClusterError, complaint, sh
from .launch import TRANSPORT_ENV, node_command
from .state import BRIDGE_ADDRESS, Cluster, record, state_dir

PARTITION = "emulated"
#: Slurm CPUs per CPU of a node (more than 1 lets small jobs share a node here).
CPUS_PER_CPU = 2
WAIT_S = 60


def local_cluster_script() -> Path:
    path = Path(__file__).resolve().parents[2] / "jobs" / "slurm" / "local-cluster.sh"
    if not path.exists():
        raise ClusterError(f"--slurm needs the source tree's {path.relative_to(path.parents[2])} "
                           "(install syncbench from a clone: pip install -e .)")
    return path


def fragment(cluster: Cluster) -> str:
    """The lines appended to ``slurm.conf``."""
    lines = [f"TaskProlog={state_dir() / 'task-prolog'}"]
    for node in cluster.nodes:
        cpus = node.cpu_count * CPUS_PER_CPU
        lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={cpus} State=UNKNOWN")
    names = ",".join(n.name for n in cluster.nodes)
    lines.append(f"PartitionName={PARTITION} Nodes={names} Default=NO MaxTime=INFINITE "
                 "State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


#: MPICH under ``srun --mpi=pmi2`` on the nodes takes the OFI netmod (libfabric's tcp,
#: across the links: 442 MB crossed each veth for the 440 MB an epoch of mlp allreduces).
#: With UCX its address is split over several PMI2 values, and with this MPICH wheel and
#: Slurm 22.05 that exchange failed for some command lines and not for others
#: (slurmstepd: "mpi/pmi2: value not properly terminated in client request", then
#: MPI_Init: "MPIDI_UCX_comm_addr_exchange ... Destination is unreachable"); with OFI's
#: short address it did not fail. Launches through mpiexec (Hydra's PMI) keep UCX.
SRUN_MPICH_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


def task_prolog(cluster: Cluster) -> str:
    """Exports for tasks on the emulated nodes (Slurm reads ``export NAME=VALUE`` lines)."""
    settings = {**TRANSPORT_ENV["mpich"], **SRUN_MPICH_ENV, **TRANSPORT_ENV["openmpi"]}
    exports = "\n".join(f'  [ -n "${{{name}:-}}" ] || echo "export {name}={value}"'
                        for name, value in settings.items())
    names = "|".join(n.name for n in cluster.nodes)
    speeds = "".join(f'  {n.name}) echo "export SYNCBENCH_NODE_SPEED={n.speed:g}";;\n'
                     for n in cluster.nodes if n.speed < 1)
    return (f'#!/bin/sh\n# syncbench emulated cluster: transports for tasks on its nodes.\n'
            f'case "$SLURMD_NODENAME" in {names})\n{exports}\n  ;;\nesac\n'
            f'case "$SLURMD_NODENAME" in\n{speeds}esac\n')


def _local_cluster(env_extra: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_CTLD_ADDR", "SLURM_EXTRA_CONF")}
    env.update(env_extra)
    proc = subprocess.run(["bash", str(local_cluster_script())], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        said = complaint(proc).splitlines()
        raise ClusterError(f"the local Slurm cluster did not start: {said[-1] if said else ''}")


def slurmd_command(conf: str, name: str) -> str:
    """Inside a node: its own cgroup mounts, then ``slurmd -N NAME``."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, opts, *_ = line.split()
        if where.startswith("/sys/fs/cgroup/") and kind in ("cgroup", "cgroup2"):
            options = ",".join(o for o in opts.split(",")
                               if o not in ("rw", "relatime", "nosuid", "nodev", "noexec"))
            mounts.append(f"mkdir -p {where} && mount -t {kind} -o {options or 'defaults'} "
                          f"{kind} {where}")
    setup = " && ".join(["mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup", *mounts,
                         f"mkdir -p /var/spool/slurmd/{name}"])
    return f"{setup} && exec /usr/sbin/slurmd -f {conf} -N {name}"


def add_nodes(cluster: Cluster) -> None:
    """Nodes into slurm.conf, a slurmd in each, then wait until they are idle."""
    folder = state_dir()
    (folder / "slurm-nodes.conf").write_text(fragment(cluster))
    prolog = folder / "task-prolog"
    prolog.write_text(task_prolog(cluster))
    prolog.chmod(0o755)
    record(cluster, "slurm-conf", "slurm.conf")
    _local_cluster({"SLURM_CTLD_ADDR": BRIDGE_ADDRESS,
                    "SLURM_EXTRA_CONF": str(folder / "slurm-nodes.conf")})
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    for node in cluster.nodes:
        argv = node_command(cluster, node.name, ["sh", "-c", slurmd_command(conf, node.name)])
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"slurmd of {node.name} did not start: "
                               f"{complaint(proc)[-200:]}")
        record(cluster, "slurmd", node.name)
    wait_idle(cluster)


def wait_idle(cluster: Cluster) -> None:
    deadline = time.monotonic() + WAIT_S
    names = ",".join(n.name for n in cluster.nodes)
    states: list[str] = []
    while time.monotonic() < deadline:
        out = sh(["sinfo", "-h", "-N", "-n", names, "-o", "%N %t"], "sinfo", check=False).stdout
        states = out.split("\n")
        pairs = [line.split() for line in states if line.strip()]
        if len(pairs) == len(cluster.nodes) and all(s in ("idle", "mix", "alloc")
                                                     for _, s in pairs):
            return
        for name, state in pairs:
            if state.startswith(("down", "drain", "fail", "inval")):
                sh(["scontrol", "update", f"nodename={name}", "state=resume"], "resume",
                   check=False)
        time.sleep(1)
    raise ClusterError(f"Slurm nodes not idle after {WAIT_S} s ({'; '.join(states)}): see "
                       "/var/log/slurm/slurmd-<node>.log")


def remove_nodes(cluster: Cluster) -> None:
    """Stop the node daemons, then slurm.conf without the nodes (the host node stays)."""
    for obj in cluster.made:
        if obj["kind"] != "slurmd":
            continue
        pidfile = Path(f"/run/slurmd-{obj['name']}.pid")
        try:
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
    if any(obj["kind"] == "slurm-conf" for obj in cluster.made):
        _local_cluster({})
