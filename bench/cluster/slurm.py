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

The local cluster lives in a folder of its own (``$SYNCBENCH_SLURM_DIR``, default
``/run/syncbench-slurm``: its ``slurm.conf``, munged, pid files, state, spool and
logs), so the host's ``/etc/slurm`` and ``/etc/munge`` are never written; Slurm's
commands reach it through ``SLURM_CONF`` (:func:`slurm_conf`, printed by ``up``).
A daemon is stopped only through the record written when it was started
(``run/NAME.started``: its pid and start time) and only while that pid is still
the process started then (:func:`stop_daemon`): a pid file's number may by then
name another process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from syncbench.bench.files import WriteError, write_atomic
from syncbench.bench.processes import Process, signal_if_same

from .host import ClusterError, complaint
from .launch import TRANSPORT_ENV, node_command, node_env
from .state import BRIDGE_ADDRESS, Cluster, record, state_dir, write_file

PARTITION = "emulated"
#: Slurm CPUs per CPU of a node (more than 1 lets small jobs share a node here).
CPUS_PER_CPU = 2
WAIT_S = 60
#: Seconds a stopped daemon has to end before it is sent SIGKILL.
STOP_S = 10
#: The first line of every slurm.conf ``local-cluster.sh`` writes; it refuses any other.
HEADER = ("# Written by syncbench jobs/slurm/local-cluster.sh: one node, no cgroups, "
          "no accounting.")


def slurm_dir() -> Path:
    """The local cluster's folder (``jobs/slurm/local-cluster.sh``'s ``SYNCBENCH_SLURM_DIR``)."""
    return Path(os.environ.get("SYNCBENCH_SLURM_DIR", "/run/syncbench-slurm"))


def slurm_conf() -> Path:
    """The local cluster's ``slurm.conf``: what ``SLURM_CONF`` must name to reach it."""
    return slurm_dir() / "slurm.conf"


def slurm_env() -> dict[str, str]:
    """This environment with ``SLURM_CONF`` naming the local cluster."""
    return {**os.environ, "SLURM_CONF": str(slurm_conf())}


def check_conf_is_ours() -> None:
    """Refuse (one line) a ``slurm.conf`` in the cluster's folder that ``local-cluster.sh``
    did not write: a site's configuration is never rewritten."""
    conf = slurm_conf()
    try:
        with conf.open(errors="replace") as f:
            first = f.readline().rstrip("\n")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ClusterError(f"cannot read {conf}: {exc.strerror}") from None
    if first != HEADER:
        raise ClusterError(f"{conf} was not written by local-cluster.sh (its first line is not "
                           "the script's header): left as it is; set SYNCBENCH_SLURM_DIR to a "
                           "folder of its own")


def start_time(pid: int) -> int | None:
    """A live process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22),
    or None when there is no such process or it has ended (a zombie nobody reaped)."""
    process = Process.of(pid, live=True)
    return process.start if process else None


def _record_path(name: str) -> Path:
    return slurm_dir() / "run" / f"{name}.started"


def record_daemon(name: str, comm: str, pidfile: Path, wait_s: float = 10.0) -> int:
    """After starting daemon ``comm``, which writes ``pidfile``: wait for a live ``comm``
    there, then record its pid and start time as ``run/NAME.started``; its pid."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            process = Process.of(int(pidfile.read_text()), live=True)
        except (OSError, ValueError):
            process = None
        if process is not None and process.comm == comm:
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"{comm} did not start: no live {comm} in {pidfile} after "
                               f"{wait_s:g} s (see {slurm_dir() / 'log'})")
        time.sleep(0.1)
    try:
        write_atomic(_record_path(name), f"{process.pid} {process.start}\n".encode())
    except WriteError as exc:
        raise ClusterError(str(exc)) from None
    return process.pid


def _recorded(name: str, comm: str) -> Process | None:
    """The daemon recorded as ``run/NAME.started`` (its pid and start time, name
    ``comm``); None if nothing is recorded."""
    try:
        pid, start = (int(word) for word in _record_path(name).read_text().split())
    except (OSError, ValueError):
        return None
    return Process(pid, comm, start)


def recorded_pid(name: str, comm: str) -> int | None:
    """The pid recorded as ``run/NAME.started`` while it is still the process started then
    (the same name ``comm`` and start time, not ended); else None."""
    process = _recorded(name, comm)
    return process.pid if process is not None and process.still_there(live=True) else None


def _signal(name: str, comm: str, sig: int) -> bool:
    """Send ``sig`` to the recorded daemon if it is still ours (checked after the pid is
    pinned by a pidfd, :func:`signal_if_same`); whether it was sent."""
    process = _recorded(name, comm)
    return process is not None and signal_if_same(process, sig, live=True)


def stop_daemon(name: str, comm: str, wait_s: float = STOP_S) -> bool:
    """Stop the daemon recorded as ``run/NAME.started`` if it is still the process started
    then (SIGTERM, SIGKILL after ``wait_s``), and forget the record; whether one was
    stopped. A daemon not recorded, or a pid now naming another process, is left alone."""
    stopped = False
    if _signal(name, comm, signal.SIGTERM):
        stopped = True
        deadline = time.monotonic() + wait_s
        while recorded_pid(name, comm) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(name, comm, signal.SIGKILL)
    _record_path(name).unlink(missing_ok=True)
    return stopped


def _slurm_tool(args: list[str]) -> subprocess.CompletedProcess:
    """A Slurm command (sinfo, scontrol) against the local cluster."""
    return subprocess.run(args, capture_output=True, text=True, env=slurm_env())


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
    envs = {n.name: node_env(cluster, n) for n in cluster.nodes}
    speeds = "".join(f'  {name}) ' + "; ".join(f'echo "export {k}={v}"' for k, v in env.items())
                     + ";;\n" for name, env in envs.items() if env)
    return (f'#!/bin/sh\n# syncbench emulated cluster: transports for tasks on its nodes.\n'
            f'case "$SLURMD_NODENAME" in {names})\n{exports}\n  ;;\nesac\n'
            f'case "$SLURMD_NODENAME" in\n{speeds}esac\n')


def _local_cluster(env_extra: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_CTLD_ADDR", "SLURM_EXTRA_CONF", "SLURM_CONF")}
    env.update(env_extra)
    proc = subprocess.run(["bash", str(local_cluster_script())], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        said = complaint(proc).splitlines()
        raise ClusterError(f"the local Slurm cluster did not start: {said[-1] if said else ''}")


def slurmd_command(conf: str | Path, name: str) -> str:
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
                         f"mkdir -p {slurm_dir() / 'spool' / name}"])
    return f"{setup} && exec /usr/sbin/slurmd -f {conf} -N {name}"


def add_nodes(cluster: Cluster) -> None:
    """Nodes into slurm.conf, a slurmd in each, then wait until they are idle."""
    check_conf_is_ours()
    nodes_conf = write_file(cluster, "slurm-nodes.conf", fragment(cluster))
    write_file(cluster, "task-prolog", task_prolog(cluster), mode=0o755)
    record(cluster, "slurm-conf", "slurm.conf")
    _local_cluster({"SLURM_CTLD_ADDR": BRIDGE_ADDRESS,
                    "SLURM_EXTRA_CONF": str(nodes_conf)})
    conf = slurm_conf()
    for node in cluster.nodes:
        pidfile = slurm_dir() / "run" / f"slurmd-{node.name}.pid"
        pidfile.unlink(missing_ok=True)
        argv = node_command(cluster, node.name, ["sh", "-c", slurmd_command(conf, node.name)])
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"slurmd of {node.name} did not start: "
                               f"{complaint(proc)[-200:]}")
        record(cluster, "slurmd", node.name)
        record_daemon(f"slurmd-{node.name}", "slurmd", pidfile)
    wait_idle(cluster)
    print(f"syncbench cluster: Slurm partition {PARTITION} in {conf}: "
          f"export SLURM_CONF={conf} to submit to it")


def wait_idle(cluster: Cluster) -> None:
    deadline = time.monotonic() + WAIT_S
    names = ",".join(n.name for n in cluster.nodes)
    states: list[str] = []
    while time.monotonic() < deadline:
        out = _slurm_tool(["sinfo", "-h", "-N", "-n", names, "-o", "%N %t"]).stdout
        states = out.split("\n")
        pairs = [line.split() for line in states if line.strip()]
        if len(pairs) == len(cluster.nodes) and all(s in ("idle", "mix", "alloc")
                                                     for _, s in pairs):
            return
        for name, state in pairs:
            if state.startswith(("down", "drain", "fail", "inval")):
                _slurm_tool(["scontrol", "update", f"nodename={name}", "state=resume"])
        time.sleep(1)
    raise ClusterError(f"Slurm nodes not idle after {WAIT_S} s ({'; '.join(states)}): see "
                       f"{slurm_dir() / 'log'}/slurmd-<node>.log")


def remove_nodes(cluster: Cluster) -> None:
    """Stop the node daemons ``up`` started (each only while its recorded pid is still
    that slurmd), then slurm.conf without the nodes (the host node stays)."""
    for obj in cluster.made:
        if obj["kind"] != "slurmd":
            continue
        stop_daemon(f"slurmd-{obj['name']}", "slurmd")
        with contextlib.suppress(OSError):
            (slurm_dir() / "run" / f"slurmd-{obj['name']}.pid").unlink(missing_ok=True)
    if any(obj["kind"] == "slurm-conf" for obj in cluster.made):
        _local_cluster({})
