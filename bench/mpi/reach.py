"""Who answers: the hang guard's view of the network (``--timeout``).

When every rank waits inside MPI, the heartbeats cannot tell a slow rank
from a cable pulled out of its node. So each rank's guard opens a TCP
listener at the start (it only has to exist: the kernel completes a
``connect`` to a listening socket, whatever the process is doing) and the
ranks gather ``(rank, host, addresses, port)`` once. At a timeout a rank
connects to the others' listeners, all at once, for :data:`PROBE_TIMEOUT_S`:

* ``answers``: the connection was made; the rank is alive and its node reachable;
* ``refused``: its node answered (RST) but nothing listens: the rank is gone;
* ``unreachable``: no answer in time, or no route (the neighbour lookup failed):
  the node cannot be reached: a network fault.

The launcher's host is probed the same way, on a port nobody listens on (an
RST is an answer): a rank that cannot reach it is cut off, and what it
prints would never reach the user. Its address comes from the command line of
the launcher's agent the rank runs under (MPICH hydra's ``hydra_pmi_proxy
--control-port HOST:PORT``, PRRTE's ``prted ... prte_hnp_uri
"...;tcp://IP,IP:PORT..."``); the launcher's own port is never connected to
(hydra takes a stray connection on its control port for a broken proxy).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: Seconds a probe waits for an answer (one lost SYN is resent after 1 s).
PROBE_TIMEOUT_S = 2.0
#: Connections opened at once (each is a file descriptor).
PROBE_BATCH = 256
#: A port nobody listens on: the launcher's host answers a connect with an RST.
CLOSED_PORT = 1
#: Launcher agents a rank runs under (``/proc/PID/comm``): MPICH hydra, PRRTE.
HYDRA_AGENTS = ("hydra_pmi_proxy",)
PRRTE_AGENTS = ("prted", "prterun", "mpirun", "mpiexec", "orterun")
_SIOCGIFADDR = 0x8915

ANSWERS, REFUSED, UNREACHABLE = "answers", "refused", "unreachable"


def local_addresses() -> list[str]:
    """IPv4 addresses of this host's interfaces, loopback left out."""
    found: list[str] = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return found


class Listener:
    """A TCP listener on every address; a thread accepts and closes what connects."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("", 0))
        self.sock.listen(128)
        self.port: int = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, name="syncbench-listener", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


@dataclass(frozen=True)
class Peer:
    """Where one rank's guard listens."""

    rank: int
    host: str
    addresses: tuple[str, ...]
    port: int


def targets(me: Peer, peers: Iterable[Peer], all_peers: Iterable[Peer]) -> dict[int, list]:
    """``(address, port)`` to probe per rank of ``peers``, as seen from ``me``.

    A rank on this host is probed on ``127.0.0.1``. Elsewhere only the
    addresses that name one host among ``all_peers`` are used: an address
    that several hosts carry (a container bridge's ``172.17.0.1``) would
    reach the prober's own host.
    """
    owners: dict[str, set[str]] = {}
    for peer in all_peers:
        for address in peer.addresses:
            owners.setdefault(address, set()).add(peer.host)
    result = {}
    for peer in peers:
        if peer.host == me.host:
            result[peer.rank] = [("127.0.0.1", peer.port)]
        else:
            result[peer.rank] = [(a, peer.port) for a in peer.addresses if len(owners[a]) == 1]
    return result


def probe(targets: dict, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """``answers`` / ``refused`` / ``unreachable`` per key of ``targets`` (key: list of
    ``(address, port)``); a key answers if any of its addresses does."""
    order = {ANSWERS: 2, REFUSED: 1, UNREACHABLE: 0}
    result = {key: UNREACHABLE for key in targets}
    pairs = [(key, where) for key, wheres in targets.items() for where in wheres]
    for first in range(0, len(pairs), PROBE_BATCH):
        for key, outcome in _probe_batch(pairs[first:first + PROBE_BATCH], timeout):
            if order[outcome] > order[result[key]]:
                result[key] = outcome
    return result


def _probe_batch(pairs: list, timeout: float) -> list:
    outcomes = []
    selector = selectors.DefaultSelector()
    try:
        for key, (address, port) in pairs:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((address, port))
            if code in (0, errno.EINPROGRESS):
                selector.register(sock, selectors.EVENT_WRITE, key)
            else:
                outcomes.append((key, _outcome(code)))
                sock.close()
        deadline = time.monotonic() + timeout
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for item, _ in selector.select(left):
                sock = item.fileobj
                outcomes.append((item.data, _outcome(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))))
                selector.unregister(sock)
                sock.close()
    finally:
        for item in list(selector.get_map().values()):
            outcomes.append((item.data, UNREACHABLE))
            item.fileobj.close()
        selector.close()
    return outcomes


def _outcome(code: int) -> str:
    if code == 0:
        return ANSWERS
    if code == errno.ECONNREFUSED:
        return REFUSED
    return UNREACHABLE  # EHOSTUNREACH, ENETUNREACH, a timeout


# -- the launcher ---------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int]:
    """``(comm, ppid)`` of a process (comm may hold spaces and parentheses)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    comm = text[text.index("(") + 1:text.rindex(")")]
    return comm, int(text[text.rindex(")") + 2:].split()[1])


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [w.decode(errors="replace") for w in f.read().split(b"\0") if w]


def agents(pid: int | None = None, depth: int = 6) -> list[tuple[int, str]]:
    """``(pid, comm)`` of the launcher agents above this process, nearest first:
    the unbroken chain of hydra or PRRTE processes starting at the parent."""
    chain: list[tuple[int, str]] = []
    try:
        _, parent = _stat(pid or os.getpid())
        while parent > 1 and len(chain) < depth:
            comm, above = _stat(parent)
            if comm not in HYDRA_AGENTS + PRRTE_AGENTS:
                break
            chain.append((parent, comm))
            parent = above
    except (OSError, ValueError, IndexError):
        pass
    return chain


_HYDRA_PORT = re.compile(r"^\[?([^\]\s]+?)\]?:\d+$")
_PRRTE_URI = re.compile(r"tcp4?://([0-9.,]+):\d+")


def launcher_addresses(chain: list[tuple[int, str]] | None = None) -> list[str]:
    """IPv4 addresses of the launcher's host, from its agents' command lines."""
    found: list[str] = []
    for pid, _ in agents() if chain is None else chain:
        try:
            found.extend(addresses_in(_cmdline(pid)))
        except OSError:
            continue
    return list(dict.fromkeys(found))


def addresses_in(words: list[str]) -> list[str]:
    """The launcher's addresses in one agent's command line: hydra's ``--control-port
    HOST:PORT``, PRRTE's ``tcp://IP,IP:PORT`` in ``prte_hnp_uri``."""
    found: list[str] = []
    for i, word in enumerate(words):
        if word == "--control-port" and i + 1 < len(words):
            match = _HYDRA_PORT.match(words[i + 1])
            if match:
                found.extend(_resolve(match.group(1)))
        if i > 0 and words[i - 1] == "prte_hnp_uri":
            for match in _PRRTE_URI.finditer(word):
                found.extend(a for a in match.group(1).split(",") if a)
    return list(dict.fromkeys(found))


def _resolve(host: str) -> list[str]:
    try:
        return [socket.gethostbyname(host)]
    except OSError:
        return []


def prrte_root(chain: list[tuple[int, str]]) -> int | None:
    """The PRRTE process the launcher started on this node (the top of the chain):
    PRRTE ends the job at once when it ends abnormally, while the
    launcher is not yet tearing the job down (``ssh_wait_daemon``)."""
    prrte = [pid for pid, comm in chain if comm in PRRTE_AGENTS]
    if not prrte or any(comm in HYDRA_AGENTS for _, comm in chain):
        return None
    return prrte[-1]
