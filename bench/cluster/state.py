"""The emulated cluster's one state file: its layout, every object ``up`` made, its files.

``up`` records each kernel object (namespace, link, cgroup, daemon) the moment
it exists, with what identifies it beyond its name (a link's interface index,
a namespace's inode, a cgroup's path and inode, and the host's boot id), so
``down`` removes exactly what was made, also after an ``up`` that failed
half-way, and never an object of the same name it did not make. The files the
cluster writes into the folder are listed too; ``down`` removes those and no
other. The folder is ``$SYNCBENCH_CLUSTER_DIR`` (default
``/run/syncbench-cluster``: a tmpfs, so a reboot, which removes every object,
also forgets them).

Root acts on what the folder says, so the folder must be root's: a directory
(not a symlink) owned by root (or by the user running, who then acts with
their own rights only), with no permission beyond 0755, under parents only
root can change. Anything else is refused in one line. Every file is written
through ``mkstemp`` and renamed into place (:func:`~syncbench.bench.files.write_atomic`:
never through a symlink, never rewritten in place), and every change is a
read-modify-write under the folder's lock (:func:`changing`), so concurrent
``up``, ``speed`` and ``link`` never lose each other's entries.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from syncbench.bench.files import ExclusiveLock, LockHeld, WriteError, write_atomic

from .host import ClusterError

#: Names and addresses of the emulated cluster: one prefix, one private /24 subnet
#: (``$SYNCBENCH_CLUSTER_PREFIX``, ``$SYNCBENCH_CLUSTER_SUBNET``: a second cluster can
#: live beside the first under other names). Checked by :func:`check_names`.
PREFIX = os.environ.get("SYNCBENCH_CLUSTER_PREFIX", "sb")
BRIDGE = f"{PREFIX}br0"
SUBNET = os.environ.get("SYNCBENCH_CLUSTER_SUBNET", "10.77.0")
BRIDGE_ADDRESS = f"{SUBNET}.254"
MAX_NODES = 64

#: A prefix: the longest name made from it (``<prefix>br0probe``) fits IFNAMSIZ (15).
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,6}$")
#: A node, namespace or link name in a state file (safe in shell text, at most 15).
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,14}$")
SUBNET_RE = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}$")
#: A state folder's path: no character a shell or slurm.conf would read as syntax.
PATH_RE = re.compile(r"^/[A-Za-z0-9._/+-]*$")
CPUS_RE = re.compile(r"^(\d{1,4}(,\d{1,4})*)?$")
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps))?$", re.I)
#: A ``tc`` size (tc(8), "SIZES"): a number, then k, m or g (1024s), then b (bytes) or bit.
BURST_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)(b|bit)?$", re.I)


def valid_burst(burst: str) -> bool:
    """Whether ``burst`` is ``auto`` or a ``tc`` size (``256kb``)."""
    return burst == "auto" or bool(BURST_RE.match(burst))


#: A node's measured quota pattern: ``ON/OFF`` or ``ON/OFF/FIRST10-FIRST90`` milliseconds,
#: or "" (no quota).
_MS = r"\d+(?:\.\d+)?"
THROTTLE_RE = re.compile(rf"^({_MS}/{_MS}(?:/{_MS}-{_MS})?)?$")
CGROUP_PROCS_RE = re.compile(r"^/sys/fs/cgroup/(?:[a-z_,]+/)?([A-Za-z][A-Za-z0-9]{0,14})/"
                             r"cgroup\.procs$")
CGROUP_RE = re.compile(r"^/sys/fs/cgroup/(?:[a-z_,]+/)?([A-Za-z][A-Za-z0-9]{0,14})$")

STATE_NAME = "state.json"
LOCK_NAME = "state.json.lock"
#: The other files a cluster may write into its folder (each recorded once written).
FILES = ("node-ssh", "slurm-nodes.conf", "task-prolog")
KINDS = ("link", "netns", "cgroup", "slurm-conf", "slurmd")
#: How long ``speed``, ``link`` and ``down`` wait for another change to end (``up``
#: does not wait: a second ``up`` fails at once, naming the holder).
LOCK_WAIT_S = 30.0


class StateError(ClusterError, ValueError):
    """The state folder or file cannot be trusted or read (one line)."""


def check_names(prefix: str | None = None, subnet: str | None = None) -> None:
    """Refuse a prefix or subnet that is not a plain name / a private /24 (one line)."""
    prefix = PREFIX if prefix is None else prefix
    subnet = SUBNET if subnet is None else subnet
    if not PREFIX_RE.match(prefix):
        raise StateError(f"SYNCBENCH_CLUSTER_PREFIX {prefix!r}: 1 to 7 lowercase letters and "
                         "digits, starting with a letter")
    subnet_network(subnet)


def subnet_network(subnet: str) -> ipaddress.IPv4Network:
    """``10.77.0`` as ``10.77.0.0/24`` (a private IPv4 /24), else a one-line error."""
    problem = f"SYNCBENCH_CLUSTER_SUBNET {subnet!r}: the first three numbers of a private " \
              "IPv4 /24 such as 10.77.0"
    if not SUBNET_RE.match(subnet):
        raise StateError(problem)
    try:
        network = ipaddress.IPv4Network(f"{subnet}.0/24")
    except ValueError:
        raise StateError(problem) from None
    if not network.is_private or network.is_loopback or network.is_link_local or \
            network.is_multicast or network.is_unspecified:
        raise StateError(problem)
    return network


def state_dir() -> Path:
    """Where the state file, the launcher shim and Slurm's fragments live."""
    default = "/run/syncbench-cluster" + ("" if PREFIX == "sb" else f"-{PREFIX}")
    return Path(os.environ.get("SYNCBENCH_CLUSTER_DIR", default))


def state_file() -> Path:
    return state_dir() / STATE_NAME


def lock_file() -> Path:
    return state_dir() / LOCK_NAME


def boot_id() -> str:
    """This boot's id (a reboot removes every object a state file lists)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def check_folder(folder: Path | None = None) -> Path:
    """The state folder, checked: a real directory, root's (or this user's), mode <= 0755,
    under parents only root can change. Raises :class:`StateError` (one line)."""
    folder = folder or state_dir()
    if not PATH_RE.match(str(folder)) or ".." in folder.parts:
        raise StateError(f"state folder {str(folder)!r}: an absolute path of letters, digits "
                         "and ._+-/ only (SYNCBENCH_CLUSTER_DIR)")
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise StateError(f"state folder {folder} does not exist") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise StateError(f"state folder {folder} is {what}: refused (SYNCBENCH_CLUSTER_DIR "
                         "must name a folder only root can change)")
    mode = stat.S_IMODE(st.st_mode)
    if not _trusted_owner(st.st_uid) or mode & ~0o755:
        raise StateError(f"state folder {folder} is owned by uid {st.st_uid} with mode "
                         f"{mode:04o}: refused (it must be root's, mode 0755 or less)")
    real = Path(os.path.realpath(folder.parent))
    for parent in (real, *real.parents):
        pst = os.stat(parent)
        pmode = stat.S_IMODE(pst.st_mode)
        if not _trusted_owner(pst.st_uid) or (pmode & 0o022 and not pmode & stat.S_ISVTX):
            raise StateError(f"state folder {folder}: its parent {parent} (uid {pst.st_uid}, "
                             f"mode {pmode:04o}) can be changed by others: refused")
    return folder


def check_file(path: Path) -> Path:
    """A file of the state folder that root executes or reads: a regular file (not a
    symlink), root's (or this user's), mode <= 0755. Raises :class:`StateError`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StateError(f"{path} is missing: take the cluster down and up again") from None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st.st_uid) or mode & ~0o755:
        raise StateError(f"{path} is not a regular file of root's with mode 0755 or less "
                         f"(uid {st.st_uid}, mode {mode:04o}): refused")
    return path


def prepare_folder() -> bool:
    """Make the state folder (mode 0755) if it is missing, then check it; True if made."""
    folder = state_dir()
    made = False
    if not os.path.lexists(folder):
        if not PATH_RE.match(str(folder)) or ".." in folder.parts:
            check_folder(folder)  # the one-line refusal of the path
        try:
            folder.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mkdir(folder, 0o755)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateError(f"cannot make the state folder {folder}: {exc.strerror}") from None
    check_folder(folder)
    return made


@dataclass
class Node:
    """One emulated node."""

    index: int
    #: Network namespace and hostname (the same word).
    name: str
    address: str
    #: Host-side end of its veth pair (the node's end is ``eth0`` inside).
    veth: str
    cpus: str = ""
    speed: float = 1.0
    clock_offset_s: float = 0.0
    #: The speed ``up`` gave it (``--node-speed``), which ``cluster speed`` and the
    #: runner's configurations leave alone: what a scenario's node speeds are relative to.
    up_speed: float = 1.0
    #: cgroup.procs files a process joins to take the node's CPU set and quota.
    cgroup_procs: list[str] = field(default_factory=list)
    #: The rate ``cluster link NODE RATE`` set since ``up`` (else the cluster's ``link``).
    link: str = ""
    #: How the kernel realises the node's quota, measured when it was set:
    #: ``ON/OFF[/FIRST10-FIRST90]``, milliseconds a never-idle process runs, then is
    #: frozen, and the spread of the first run after an idle spell ("" at speed 1;
    #: :func:`.cpu.throttle_pattern`).
    throttle: str = ""

    @property
    def cpu_count(self) -> int:
        """The CPUs of its CPU set (1 when it has none and shares the host's)."""
        return len(self.cpus.split(",")) if self.cpus else 1


@dataclass
class Cluster:
    """The layout asked for and the objects made, in the order they were made."""

    nodes: list[Node]
    link: str = ""
    burst: str = "auto"
    slurm: bool = False
    #: CFS period of the nodes' CPU quotas, microseconds.
    cpu_period_us: int = 100_000
    #: ``{"kind", "name"}`` and the object's identity (``ifindex``, ``inode``).
    made: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The bridge and its address (the names this cluster was made under).
    bridge: str = BRIDGE
    bridge_address: str = BRIDGE_ADDRESS
    #: The files of the state folder this cluster wrote (names in it, from :data:`FILES`).
    files: list[str] = field(default_factory=list)
    #: Whether ``up`` made the state folder (``down`` then removes it, if empty).
    made_folder: bool = False
    #: The boot the objects were made in (:func:`boot_id`).
    boot_id: str = ""

    def node(self, host: str) -> Node | None:
        """The node a launcher names by address, name or ``name.domain``."""
        for node in self.nodes:
            if host in (node.address, node.name) or host.split(".")[0] == node.name:
                return node
        return None

    def require_node(self, host: str) -> Node:
        """:meth:`node`, or a :class:`ClusterError` that lists the nodes."""
        node = self.node(host)
        if node is None:
            raise ClusterError(f"no node {host!r} (nodes: "
                               f"{', '.join(n.name for n in self.nodes)})")
        return node

    def layout(self) -> dict[str, Any]:
        """What ``up`` was asked for: two ``up`` with the same layout are one cluster."""
        return {"nodes": [(n.name, n.speed, n.clock_offset_s) for n in self.nodes],
                "link": self.link, "burst": self.burst, "slurm": self.slurm,
                "cpu_period_us": self.cpu_period_us}

    def describe(self) -> str:
        """One phrase naming the cluster: its nodes and bridge."""
        names = ", ".join(n.name for n in self.nodes) or "no nodes"
        return f"{len(self.nodes)} nodes ({names}) on bridge {self.bridge}"

    def rebooted(self) -> bool:
        """Whether the host rebooted since ``up`` (every object it made is gone)."""
        now = boot_id()
        return bool(self.boot_id and now and self.boot_id != now)


def node_name(index: int) -> str:
    return f"{PREFIX}node{index}"


def veth_name(index: int) -> str:
    return f"{PREFIX}v{index}"


def _validate(cluster: Cluster, where: Path) -> Cluster:
    """Refuse a state whose names or values would reach a command or shell text unchecked.

    Objects in ``made`` are checked one by one when they are removed (a name that is not
    the cluster's, or an identity that does not match, is left alone)."""
    def bad(what: str) -> StateError:
        return StateError(f"state file {where}: {what}: refused (not written by "
                          "syncbench cluster; remove the folder's state.json by hand)")

    if not NAME_RE.match(cluster.bridge):
        raise bad(f"bridge name {cluster.bridge!r}")
    for text in (cluster.bridge_address, *(n.address for n in cluster.nodes)):
        try:
            ipaddress.IPv4Address(text)
        except ValueError:
            raise bad(f"address {text!r}") from None
    if not RATE_RE.match(cluster.link) or not valid_burst(cluster.burst):
        raise bad(f"link {cluster.link!r} / burst {cluster.burst!r}")
    if not 1000 <= int(cluster.cpu_period_us) <= 1_000_000:
        raise bad(f"cpu_period_us {cluster.cpu_period_us!r}")
    if len(cluster.nodes) > MAX_NODES or any(f not in FILES for f in cluster.files):
        raise bad(f"{len(cluster.nodes)} nodes, files {cluster.files}")
    for node in cluster.nodes:
        _validate_node(node, bad)
    for obj in cluster.made:
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str) or \
                not isinstance(obj.get("name"), str):
            raise bad(f"made entry {obj!r}")
    return cluster


def _validate_node(node: Node, bad: Any) -> None:
    """Refuse a node whose names, CPUs, speed, clock or cgroups are not plain values."""
    if not (NAME_RE.match(node.name) and NAME_RE.match(node.veth)
            and CPUS_RE.match(node.cpus) and RATE_RE.match(node.link)):
        raise bad(f"node {node.name!r} (link {node.veth!r}, cpus {node.cpus!r})")
    if not 0.01 <= float(node.speed) <= 1.0 or not 0.01 <= float(node.up_speed) <= 1.0 \
            or not 0 <= float(node.clock_offset_s) < 1e9 \
            or float(node.clock_offset_s) != int(node.clock_offset_s):
        raise bad(f"node {node.name}: speed {node.speed!r} (at up {node.up_speed!r}), "
                  f"clock offset {node.clock_offset_s!r}")
    if not isinstance(node.throttle, str) or not THROTTLE_RE.match(node.throttle):
        raise bad(f"node {node.name}: throttle {node.throttle!r}")
    for procs in node.cgroup_procs:
        match = CGROUP_PROCS_RE.match(procs)
        if not match or match.group(1) != node.name:
            raise bad(f"node {node.name}: cgroup {procs!r}")


def _read(path: Path) -> str | None:
    """The state file's text (opened without following a symlink), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror} (a symlink is refused)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st.st_uid) or \
                stat.S_IMODE(st.st_mode) & 0o022:
            raise StateError(f"{path} is not a regular file only root can change: refused")
        with os.fdopen(fd, "r", closefd=False) as stream:
            return stream.read()
    finally:
        os.close(fd)


def load() -> Cluster | None:
    """The cluster that is up, or None (no folder, or no state file in it)."""
    folder = state_dir()
    if not os.path.lexists(folder):
        return None
    check_folder(folder)
    path = folder / STATE_NAME
    text = _read(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
        nodes = [Node(**n) for n in data.pop("nodes")]
        cluster = Cluster(nodes=nodes, **data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateError(f"state file {path} cannot be read: {exc}") from None
    try:
        return _validate(cluster, path)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, StateError):
            raise
        raise StateError(f"state file {path}: {exc}") from None


# -- the folder's lock: every change is a read-modify-write under it ------------------
_held: dict[str, tuple[ExclusiveLock, int]] = {}


@contextlib.contextmanager
def locked(wait_s: float = LOCK_WAIT_S) -> Iterator[Path]:
    """Hold the state folder's lock (re-entrant in one process); yields the folder.

    Another holder is waited for up to ``wait_s`` seconds (0: not at all), then refused
    in one line naming it."""
    folder = check_folder()
    key = str(folder)
    if key in _held:
        lock, depth = _held[key]
        _held[key] = (lock, depth + 1)
        try:
            yield folder
        finally:
            lock, depth = _held[key]
            _held[key] = (lock, depth - 1)
        return
    lock = ExclusiveLock(folder / LOCK_NAME, f"the emulated cluster's state folder {folder}")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.acquire()
            break
        except LockHeld as exc:
            if time.monotonic() >= deadline:
                raise ClusterError(str(exc)) from None
            time.sleep(0.05)
        except OSError as exc:
            raise StateError(f"cannot lock {folder / LOCK_NAME}: {exc.strerror}") from None
    _held[key] = (lock, 1)
    try:
        yield folder
    finally:
        del _held[key]
        lock.release()


@contextlib.contextmanager
def changing(wait_s: float = LOCK_WAIT_S) -> Iterator[Cluster]:
    """The cluster that is up, read afresh under the lock; saved when the block ends.

    Every change (``speed``, ``link``, the runner's node speeds) goes through here, so
    none works on a stale copy and none loses another's entries."""
    with locked(wait_s):
        cluster = load_up()
        yield cluster
        save(cluster)


def load_up() -> Cluster:
    """The cluster that is up; :class:`ClusterError` when none is, or the host rebooted
    since ``up`` (every object is gone)."""
    cluster = load()
    if cluster is None:
        raise ClusterError("no emulated cluster is up: syncbench cluster up --nodes N")
    if cluster.rebooted():
        raise ClusterError(f"the host rebooted since 'up' ({state_file()}): the cluster "
                           "is gone; 'syncbench cluster down' forgets it")
    return cluster


def save(cluster: Cluster) -> None:
    """Write the state file atomically (mkstemp beside it, renamed over it), under the lock."""
    with locked() as folder:
        try:
            write_atomic(folder / STATE_NAME,
                         (json.dumps(asdict(cluster), indent=1) + "\n").encode(), 0o644)
        except WriteError as exc:
            raise StateError(str(exc)) from None


def record(cluster: Cluster, kind: str, name: str, **identity: Any) -> None:
    """Note an object ``up`` just made (``kind``: netns, link, cgroup, slurm-conf, slurmd)
    and its identity (``ifindex``, ``inode``) in the state file at once, so that ``down``
    removes it whatever happens next, and nothing else of that name."""
    cluster.made.append({"kind": kind, "name": name, **identity})
    save(cluster)


def record_file(cluster: Cluster, name: str) -> Path:
    """Note a file of :data:`FILES` in the state before it is written; its path."""
    if name not in FILES:
        raise ValueError(f"{name!r} is not a file the cluster writes")
    if name not in cluster.files:
        cluster.files.append(name)
        save(cluster)
    return state_dir() / name


def write_file(cluster: Cluster, name: str, text: str, mode: int = 0o644) -> Path:
    """Write one of the cluster's files: recorded first, then a new file renamed into
    place (never rewritten in place: a shell reading the old one reads it whole)."""
    path = record_file(cluster, name)
    with locked():
        try:
            write_atomic(path, text.encode(), mode)
        except WriteError as exc:
            raise StateError(str(exc)) from None
    return path


def foreign_files() -> list[str]:
    """The names of :data:`FILES` (and the state file) already in the folder: another's."""
    folder = state_dir()
    return [name for name in (STATE_NAME, *FILES) if os.path.lexists(folder / name)]


def forget(cluster: Cluster) -> None:
    """Remove the files this cluster wrote (after ``down`` removed every object), the
    state file last; any other file in the folder stays."""
    folder = state_dir()
    with locked():
        for name in cluster.files:
            if name in FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / STATE_NAME)


def remove_folder(cluster: Cluster) -> None:
    """Remove the state folder if ``up`` made it and it is empty (after the lock's end)."""
    if cluster.made_folder:
        with contextlib.suppress(OSError):
            os.rmdir(state_dir())
