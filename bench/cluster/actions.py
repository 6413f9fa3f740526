"""The actions of ``syncbench cluster`` (its command line and what the emulated cluster
is: :mod:`syncbench.bench.commands.cluster`): :func:`up` makes the nodes,
:func:`status` lists them, :func:`run_mpiexec` and :func:`run_in_node` launch inside
them, :func:`set_link` and :func:`set_node_speed` change a link or a node live,
:func:`down` removes what ``up`` made; :func:`rate_bytes_per_s` and :func:`set_speeds`
serve the runner's ``--cluster``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time

from . import cpu, launch, network, slurm, state
from .host import ClusterError, require_root, require_tool, works
from .network import rate_bytes_per_s
from .state import (
    MAX_NODES,
    SUBNET,
    Cluster,
    Node,
    forget,
    load,
    node_name,
    save,
    valid_burst,
    veth_name,
)


def _per_node(text: str, count: int, what: str, default: float) -> list[float]:
    if not text:
        return [default] * count
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ClusterError(f"{what} {text!r}: expected {count} comma-separated numbers") from None
    if len(values) != count:
        raise ClusterError(f"{what} {text!r} names {len(values)} nodes, --nodes is {count}")
    return values


def requested(args: argparse.Namespace) -> Cluster:
    """The cluster ``up`` is asked for (checked, nothing made)."""
    count = args.nodes
    if not 1 <= count <= MAX_NODES:
        raise ClusterError(f"--nodes must be 1 to {MAX_NODES}, got {count}")
    if args.link:
        rate_bytes_per_s(args.link)
    if not valid_burst(args.burst):
        raise ClusterError(f"--burst {args.burst!r} is not a size such as 256kb, or auto")
    speeds = _per_node(args.node_speed, count, "--node-speed", 1.0)
    if any(not 0.01 <= s <= 1.0 for s in speeds):
        raise ClusterError(f"--node-speed {args.node_speed!r}: each speed must be in [0.01, 1] "
                           "(a quota can only slow a node down)")
    offsets = _per_node(args.clock_offset, count, "--clock-offset", 0.0)
    if any(o < 0 or o != int(o) for o in offsets):
        raise ClusterError(f"--clock-offset {args.clock_offset!r}: whole seconds >= 0 "
                           "(unshare --time takes whole seconds)")
    cpusets = cpu.plan_cpusets(count)
    nodes = [Node(index=i + 1, name=node_name(i + 1), address=f"{SUBNET}.{i + 1}",
                  veth=veth_name(i + 1), cpus=cpusets[i], speed=speeds[i], up_speed=speeds[i],
                  clock_offset_s=int(offsets[i]))
             for i in range(count)]
    period = args.cpu_period if args.cpu_period is not None else \
        float(math.ceil(1.0 / min(speeds)))
    if not 1 <= period <= 1000:
        raise ClusterError(f"--cpu-period {period:g}: 1 to 1000 ms")
    if min(speeds) * period < 1.0:  # CFS refuses a quota under 1 ms
        raise ClusterError(f"--cpu-period {period:g} ms gives node speed "
                           f"{min(speeds):g} a quota under the kernel's 1 ms minimum: use "
                           f"--cpu-period {1.0 / min(speeds):g} or more")
    return Cluster(nodes=nodes, link=args.link, burst=args.burst, slurm=args.slurm,
                   cpu_period_us=int(period * 1000))


def check_features(cluster: Cluster) -> None:
    """Refuse (one line, naming the feature) what the layout needs and the kernel lacks."""
    require_tool("ip", "iproute2")
    require_tool("unshare", "util-linux")
    if not works(["unshare", "--uts", "true"]):
        raise ClusterError("UTS namespaces are unavailable (unshare --uts fails): nodes "
                           "cannot have their own hostnames")
    if any(n.clock_offset_s for n in cluster.nodes) and \
            not works(["unshare", "--time", "--monotonic", "1", "true"]):
        raise ClusterError("time namespaces are unavailable (unshare --time fails; Linux >= "
                           "5.6 needed): --clock-offset cannot be emulated")
    if cluster.link:
        require_tool("tc", "iproute2")
        if not network.tbf_available():
            raise ClusterError("the tbf qdisc is unavailable (tc qdisc ... tbf fails): "
                               "--link cannot be shaped")
    shared = cpu.nodes_per_cpu([n.cpus for n in cluster.nodes])
    if shared == 0:
        cluster.notes.append(f"{len(cpu.host_cpus())} CPUs for {len(cluster.nodes)} nodes: "
                             "the nodes share the CPUs (no CPU set per node)")
    elif shared > 1:
        cluster.notes.append(f"{len(cpu.host_cpus())} CPUs for {len(cluster.nodes)} nodes: "
                             f"{shared} nodes on each CPU; --node-speed {1 / shared:g} on "
                             "every node gives each a fixed share of its core")


def build(cluster: Cluster) -> None:
    """Make every object, recording each in the state file as it appears."""
    save(cluster)
    network.make_bridge(cluster)
    for node in cluster.nodes:
        network.make_node(cluster, node)
        if cluster.link:
            network.shape(node, cluster.link,
                          network.bucket(rate_bytes_per_s(cluster.link), cluster.burst))
        cpu.make_cgroups(cluster, node)
        save(cluster)
    launch.write_shim(cluster)
    if cluster.slurm:
        for name in ("slurm-nodes.conf", "task-prolog"):  # what slurm.add_nodes writes
            state.record_file(cluster, name)
        slurm.add_nodes(cluster)


def up(args: argparse.Namespace) -> int:
    """Make the cluster: refused (one line, nothing made) where its names, subnet or state
    folder are taken; a second ``up`` on the folder fails at once, naming the holder of its
    lock or the cluster that is up."""
    require_root()
    state.check_names()
    cluster = requested(args)
    if os.path.lexists(state.state_dir()):
        with state.locked(wait_s=0):  # an 'up' under way holds it: refused at once
            existing = load()
            if existing is not None:
                return _already_up(existing, cluster)
    check_features(cluster)
    network.check_names_free(cluster)
    network.check_subnet_free(SUBNET)
    made_folder = state.prepare_folder()
    try:
        with state.locked(wait_s=0):
            existing = load()  # made meanwhile by an 'up' that has ended
            if existing is not None:
                return _already_up(existing, cluster)
            foreign = state.foreign_files()
            if foreign:
                raise ClusterError(f"{state.state_dir()} already holds {', '.join(foreign)}, "
                                   "which no cluster that is up wrote: remove them or pick "
                                   "another SYNCBENCH_CLUSTER_DIR")
            cluster.made_folder, cluster.boot_id = made_folder, state.boot_id()
            try:
                build(cluster)
            except (ClusterError, OSError):
                teardown(cluster)
                raise
            save(cluster)
    except BaseException:
        if made_folder:
            state.remove_folder(dataclasses.replace(cluster, made_folder=True))
        raise
    return status(cluster)


def _already_up(existing: Cluster, asked: Cluster) -> int:
    """``up`` where a state file is: the same layout is a no-op, anything else is refused."""
    if existing.rebooted():
        raise ClusterError(f"{state.state_file()} is from before the host rebooted: run "
                           "'syncbench cluster down' (it forgets it) first")
    if existing.layout() == asked.layout():
        print("syncbench cluster: already up")
        return status(existing)
    raise ClusterError(f"a cluster with other settings is up ({existing.describe()}, "
                       f"{state.state_file()}): run 'syncbench cluster down' first")


def status(cluster: Cluster | None = None) -> int:
    cluster = cluster or load()
    if cluster is None:
        print("syncbench cluster: no emulated cluster is up")
        return 1
    print(f"syncbench cluster: {len(cluster.nodes)} nodes on bridge {cluster.bridge} "
          f"({cluster.bridge_address}), links {cluster.link or 'unshaped'}"
          f"{', Slurm partition ' + slurm.PARTITION if cluster.slurm else ''}")
    print(f"{'node':<10} {'address':<12} {'cpus':<6} {'speed':>5} {'clock+s':>8} "
          f"{'link':<5} {'sent [B]':>14} {'received [B]':>14}  quota runs/frozen/first [ms]")
    for node in cluster.nodes:
        link_state = "up" if network.link_is_up(node) else "down"
        try:
            bytes_ = network.byte_counters(node)
        except OSError:
            bytes_ = {"tx_bytes_by_node": -1, "rx_bytes_by_node": -1}
        print(f"{node.name:<10} {node.address:<12} {node.cpus or 'all':<6} {node.speed:>5g} "
              f"{node.clock_offset_s:>8g} {link_state:<5} {bytes_['tx_bytes_by_node']:>14} "
              f"{bytes_['rx_bytes_by_node']:>14}  {node.throttle or '-'}")
    for note in cluster.notes:
        print(f"note: {note}")
    return 0


def identity(cluster: Cluster, obj: dict) -> tuple[str, str]:
    """Whether a recorded object is the one ``up`` made: ``("ours", "")``, ``("gone",
    "")`` (nothing of that name left), or ``("foreign", why)``: a name that is not the
    cluster's, or an object whose identity (interface index, namespace inode, cgroup
    inode, boot) is not the recorded one. Slurm's entries are ``("slurm", "")``."""
    kind, name = obj.get("kind"), str(obj.get("name"))
    nodes = {n.name for n in cluster.nodes}
    if kind in ("slurm-conf", "slurmd"):
        return ("slurm", "") if kind == "slurm-conf" or name in nodes else \
            ("foreign", "not a node of this cluster")
    if kind == "link":
        names, key, now = {cluster.bridge, *(n.veth for n in cluster.nodes)}, "ifindex", \
            (network.link_index(name) if state.NAME_RE.match(name) else None)
        said = "interface index"
    elif kind == "netns":
        names, key, now = nodes, "inode", \
            (network.netns_inode(name) if state.NAME_RE.match(name) else None)
        said = "namespace inode"
    elif kind == "cgroup":
        match = state.CGROUP_RE.match(name)
        names = {name} if match and match.group(1) in nodes else set()
        key, now, said = "inode", (cpu.cgroup_inode(name) if names else None), "inode"
    else:
        return "foreign", "not a kind of object the cluster makes"
    if name not in names:
        return "foreign", "not a name of this cluster"
    if now is None:
        return "gone", ""
    if cluster.rebooted():
        return "foreign", "the host rebooted since 'up'"
    if obj.get(key) != now:
        return "foreign", f"its {said} is {now}, 'up' recorded {obj.get(key)}"
    return "ours", ""


def _ours(cluster: Cluster, kind: str, name: str) -> bool:
    return any(o.get("kind") == kind and o.get("name") == name and
               identity(cluster, o)[0] == "ours" for o in cluster.made)


def _require_ours(cluster: Cluster, node: Node) -> None:
    """Refuse to touch a node whose link or namespace is not the one ``up`` made."""
    for kind, name in (("link", node.veth), ("netns", node.name)):
        if not _ours(cluster, kind, name):
            raise ClusterError(f"{kind} {name} is not the one 'up' made (gone, made again, or "
                               "the host rebooted): left alone; take the cluster down and up")


def teardown(cluster: Cluster) -> None:
    """Remove what the state lists, newest first, each only if it is the object ``up``
    made (:func:`identity`; any other is left alone, with one line); processes inside
    the nodes end first. Then the files the cluster wrote, and no other."""
    for node in cluster.nodes:
        if _ours(cluster, "netns", node.name):
            _end_processes(node.name)
    if cluster.slurm:
        slurm.remove_nodes(dataclasses.replace(
            cluster, made=[o for o in cluster.made if identity(cluster, o)[0] == "slurm"]))
    errors = []
    for obj in reversed(cluster.made):
        verdict, why = identity(cluster, obj)
        if verdict == "foreign":
            print(f"syncbench cluster: left {obj.get('kind')} {obj.get('name')!r} alone: "
                  f"{why} (not the object 'up' made)", file=sys.stderr)
        if verdict != "ours":
            continue
        try:
            if obj["kind"] == "cgroup":
                cpu.remove_cgroup(obj["name"])
            else:
                network.remove(obj["kind"], obj["name"])
        except ClusterError as exc:
            errors.append(str(exc))
    if errors:
        save(cluster)
        raise ClusterError("; ".join(errors))
    forget(cluster)


def _end_processes(namespace: str) -> None:
    """SIGTERM the processes inside a node's namespace, then SIGKILL those left after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        inside = network.pids(namespace)
        if not inside:
            return
        for pid in inside:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and network.pids(namespace):
            time.sleep(0.1)


def down() -> int:
    require_root()
    if load() is None:
        print("syncbench cluster: no emulated cluster is up")
        return 0
    with state.locked():
        cluster = load()  # afresh, under the lock
        if cluster is None:
            print("syncbench cluster: no emulated cluster is up")
            return 0
        teardown(cluster)
    state.remove_folder(cluster)
    print(f"syncbench cluster: removed {len(cluster.nodes)} nodes and bridge {cluster.bridge}")
    return 0


def _loaded() -> Cluster:
    return state.load_up()


def _command(words: list[str]) -> list[str]:
    return words[1:] if words[:1] == ["--"] else words


def run_mpiexec(args: argparse.Namespace) -> int:
    argv, env = launch.launch_command(_loaded(), _command(args.words), args.ranks, args.ppn,
                                      args.mpiexec)
    sys.stdout.flush()
    os.execve(argv[0], argv, env)
    return 127  # not reached


def run_in_node(args: argparse.Namespace) -> int:
    argv = launch.node_command(_loaded(), args.node, _command(args.words))
    os.execv(argv[0], argv)
    return 127  # not reached


def set_link(args: argparse.Namespace) -> int:
    require_root()
    with state.changing() as cluster:
        node = cluster.require_node(args.node)
        _require_ours(cluster, node)
        if args.state in ("up", "down"):
            network.set_link(node, args.state == "up")
        else:
            network.shape(node, args.state,
                          network.bucket(rate_bytes_per_s(args.state), cluster.burst))
            node.link = args.state
            launch.write_shim(cluster)  # ranks started from now on read the new bucket
    print(f"syncbench cluster: link of {node.name} {args.state}")
    return 0


def set_speeds(speeds: dict[str, float]) -> list[str]:
    """Give nodes (by name) new speeds, live, in one read-modify-write of the state under
    its lock (``cluster speed``, the runner's ``node_speeds``); the nodes changed."""
    with state.changing() as cluster:
        changed = []
        for name, speed in speeds.items():
            node = cluster.require_node(name)
            if node.speed != speed:
                cpu.set_speed(cluster, node, speed)
                changed.append(node.name)
        if changed:
            launch.write_shim(cluster)
    return changed


def set_node_speed(args: argparse.Namespace) -> int:
    require_root()
    try:
        speed = float(args.speed)
    except ValueError:
        raise ClusterError(f"speed {args.speed!r} is not a number in [0.01, 1]") from None
    if not 0.01 <= speed <= 1.0:
        raise ClusterError(f"node speed {speed:g}: must be in [0.01, 1]")
    name = _loaded().require_node(args.node).name
    set_speeds({name: speed})
    print(f"syncbench cluster: {name} speed {speed:g}")
    return 0
