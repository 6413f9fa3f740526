"""Who answers: the hang guard's view of the network (``--timeout``).

When every rank waits inside MPI, the heartbeats cannot tell a slow rank
from a cable pulled out of its node. So each rank's guard opens a TCP
listener at the start, on the addresses it publishes and on loopback only
(never the wildcard address), and the ranks gather ``(rank, host, addresses,
port)`` once, with a key rank 0 drew for the job (sent over MPI, never over
these sockets). At a timeout a rank connects to the others' listeners, all at
once, for :data:`PROBE_TIMEOUT_S`, and sends each a fresh random challenge;
a listener answers with its rank's state (steps done, phase) and an HMAC of
the challenge, its rank and that state under the job's key
(:class:`Identity`). A process that merely listens on a port, or relays
another rank's answer, cannot produce it:

* ``answers``: the rank proved who it is: alive, its node reachable;
* ``silent``: its node completed the connection but no proof came in time (a
  stopped rank, or another process on its port that says nothing);
* ``refused``: its node answered (RST, or a connection closed without a valid
  proof) but the rank is not there: the rank is gone;
* ``unreachable``: no answer in time, or no route (the neighbour lookup failed):
  the node cannot be reached: a network fault.

The launcher's host is probed the same way, on a port nobody listens on (an
RST is an answer; no proof is asked of it): a rank that cannot reach it is
cut off, and what it prints would never reach the user. Its address comes
from the command line of the launcher's agent the rank runs under (MPICH
hydra's ``hydra_pmi_proxy --control-port HOST:PORT``, PRRTE's ``prted ...
prte_hnp_uri "...;tcp://IP,IP:PORT..."``); the launcher's own port is never
connected to (hydra takes a stray connection on its control port for a broken
proxy).

The guard may kill its node's PRRTE daemon (``watchdog``): ``bench.processes.Process``
records that daemon's name and start time (``/proc/PID/stat``) when the run
starts, so that a PID the kernel has since given to another process is never
killed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import os
import re
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from syncbench.bench.processes import stat_fields

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

ANSWERS, SILENT, REFUSED, UNREACHABLE = "answers", "silent", "refused", "unreachable"

#: Bytes of a prober's challenge, of a listener's proof, and at most of the state after it.
CHALLENGE_BYTES = 16
PROOF_BYTES = 32
MAX_STATE_BYTES = 96
#: Seconds a listener keeps a connection that has not sent its whole challenge.
SERVE_TIMEOUT_S = 5.0
#: Connections a listener keeps open at once (the oldest is dropped beyond it).
MAX_PENDING = 256
#: Tries at one port free on every address the listener binds.
BIND_TRIES = 20
_DOMAIN = b"syncbench-guard/1\0"


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


@dataclass(frozen=True)
class Identity:
    """What a rank's listener proves: it holds the job's ``key`` and is rank ``rank``."""

    key: bytes = field(repr=False)
    rank: int

    @classmethod
    def new_key(cls) -> bytes:
        """A job's key (rank 0 draws it; every rank gets it over MPI)."""
        return secrets.token_bytes(32)

    def proof(self, challenge: bytes, state: bytes) -> bytes:
        """HMAC-SHA256 of the challenge, the rank and its state: a relayed answer of
        another rank, or an old one, does not match."""
        message = _DOMAIN + self.rank.to_bytes(4, "big") + challenge + state
        return hmac.new(self.key, message, hashlib.sha256).digest()

    def check(self, challenge: bytes, answer: bytes) -> str | None:
        """The state ``answer`` carries if it proves this identity, else None."""
        proof, state = answer[:PROOF_BYTES], answer[PROOF_BYTES:]
        if len(proof) < PROOF_BYTES or not hmac.compare_digest(
                proof, self.proof(challenge, state)):
            return None
        return state.decode(errors="replace")


class Listener:
    """The guard's TCP listener: one socket per published address and one on loopback,
    all on one port (never the wildcard address); a thread answers each challenge with
    ``state()`` and its proof (:class:`Identity`), then closes the connection.

    ``addresses`` (default :func:`local_addresses`) that cannot be bound are left out
    of :attr:`addresses`, the ones to publish. Raises ``OSError`` if no port is free on
    all of them."""

    def __init__(self, identity: Identity | None = None, addresses: Iterable[str] | None = None,
                 state: Callable[[], str] | None = None) -> None:
        self.identity = identity or Identity(Identity.new_key(), 0)
        self.state = state or (lambda: "")
        wanted = list(dict.fromkeys(local_addresses() if addresses is None else addresses))
        self.sockets, self.addresses, self.port = self._bind(
            [a for a in wanted if not a.startswith("127.")])
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="syncbench-listener",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(wanted: list[str]) -> tuple[list[socket.socket], tuple[str, ...], int]:
        """Listening sockets on loopback and every bindable address of ``wanted``, one
        port; the addresses bound and the port."""
        for _ in range(BIND_TRIES):
            sockets: list[socket.socket] = []
            bound: list[str] = []
            try:
                first = _listening("127.0.0.1", 0)
                sockets.append(first)
                port = first.getsockname()[1]
                for address in wanted:
                    try:
                        sockets.append(_listening(address, port))
                    except OSError as exc:
                        if exc.errno == errno.EADDRINUSE:
                            raise
                        continue  # not an address of this host (any more): not published
                    bound.append(address)
            except OSError as exc:
                for sock in sockets:
                    sock.close()
                if exc.errno == errno.EADDRINUSE:
                    continue  # the port is taken on one address: another port
                raise
            return sockets, tuple(bound), port
        raise OSError(errno.EADDRINUSE, "no port free on every address of this host")

    def _answer(self, challenge: bytes) -> bytes:
        try:
            state = str(self.state()).encode()[:MAX_STATE_BYTES]
        except Exception:  # the answer must go out whatever the state
            state = b""
        return self.identity.proof(challenge, state) + state

    def _serve(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._pending: dict[socket.socket, list] = {}  # conn -> [deadline, challenge so far]
        try:
            for sock in self.sockets:
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ, "listen")
            self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while not self._closed.is_set():
                for item, _ in self._selector.select(0.5):
                    if item.data == "wake":
                        return
                    if item.data == "listen":
                        self._accept(item.fileobj)
                    elif item.fileobj in self._pending:
                        self._read(item.fileobj)
                now = time.monotonic()
                for conn in [c for c, (due, _) in self._pending.items() if due < now]:
                    self._drop(conn)
        finally:
            for conn in list(self._pending):
                conn.close()
            for sock in self.sockets:
                sock.close()
            self._selector.close()

    def _accept(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except OSError:  # gone before the accept, or no descriptor left
            return
        if len(self._pending) >= MAX_PENDING:
            self._drop(next(iter(self._pending)))
        conn.setblocking(False)
        self._pending[conn] = [time.monotonic() + SERVE_TIMEOUT_S, b""]
        self._selector.register(conn, selectors.EVENT_READ, "conn")

    def _read(self, conn: socket.socket) -> None:
        """Read the challenge; once whole, answer it and close."""
        entry = self._pending[conn]
        try:
            data = conn.recv(CHALLENGE_BYTES - len(entry[1]))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        entry[1] += data
        if data and len(entry[1]) < CHALLENGE_BYTES:
            return
        if data:
            try:
                conn.send(self._answer(entry[1]))  # fits an empty send buffer
            except OSError:
                pass
        self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        self._selector.unregister(conn)
        conn.close()

    def close(self) -> None:
        """Stop listening (every socket is closed when this returns)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5.0)
        for sock in (*self.sockets, self._wake_r, self._wake_w):
            sock.close()


def _listening(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


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


_ORDER = {ANSWERS: 3, SILENT: 2, REFUSED: 1, UNREACHABLE: 0}


def probe(targets: dict, timeout: float = PROBE_TIMEOUT_S,
          identities: dict | None = None) -> dict:
    """``answers`` / ``silent`` / ``refused`` / ``unreachable`` per key of ``targets``
    (key: list of ``(address, port)``); a key answers if any of its addresses does.
    A key of ``identities`` answers only with that :class:`Identity`'s proof; any
    other key answers when a connection is made."""
    return probe_states(targets, timeout, identities)[0]


def probe_states(targets: dict, timeout: float = PROBE_TIMEOUT_S,
                 identities: dict | None = None) -> tuple[dict, dict]:
    """:func:`probe`'s outcomes, and the state each key that proved itself sent."""
    identities = identities or {}
    result = {key: UNREACHABLE for key in targets}
    states: dict = {}
    pairs = [(key, where) for key, wheres in targets.items() for where in wheres]
    for first in range(0, len(pairs), PROBE_BATCH):
        for key, outcome, state in _probe_batch(pairs[first:first + PROBE_BATCH], timeout,
                                                identities):
            if _ORDER[outcome] > _ORDER[result[key]]:
                result[key] = outcome
            if state is not None:
                states[key] = state
    return result, states


@dataclass
class _Probe:
    """One connection of a probe: connecting, then (with an identity) awaiting the proof."""

    key: object
    identity: Identity | None
    challenge: bytes = b""
    answer: bytes = b""

    def connected(self, sock: socket.socket, code: int) -> tuple[str, str | None] | None:
        """The outcome once the connection is made or failed; None: await the proof."""
        if code != 0:
            return _outcome(code), None
        if self.identity is None:
            return ANSWERS, None
        self.challenge = secrets.token_bytes(CHALLENGE_BYTES)
        try:
            sock.send(self.challenge)  # fits an empty send buffer
        except OSError:
            return REFUSED, None
        return None

    def received(self, sock: socket.socket) -> tuple[str, str | None] | None:
        """The outcome once the listener closed (or said too much); None: read on."""
        try:
            data = sock.recv(PROOF_BYTES + MAX_STATE_BYTES + 1 - len(self.answer))
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        self.answer += data
        if data and len(self.answer) <= PROOF_BYTES + MAX_STATE_BYTES:
            return None
        assert self.identity is not None
        state = self.identity.check(self.challenge, self.answer)
        return (REFUSED, None) if state is None else (ANSWERS, state)


def _probe_batch(pairs: list, timeout: float, identities: dict) -> list:
    outcomes = []
    selector = selectors.DefaultSelector()
    try:
        for key, (address, port) in pairs:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((address, port))
            if code in (0, errno.EINPROGRESS):
                selector.register(sock, selectors.EVENT_WRITE,
                                  _Probe(key, identities.get(key)))
            else:
                outcomes.append((key, _outcome(code), None))
                sock.close()
        deadline = time.monotonic() + timeout
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for item, _ in selector.select(left):
                sock, job = item.fileobj, item.data
                if job.challenge:
                    done = job.received(sock)
                else:
                    done = job.connected(
                        sock, sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
                    if done is None:
                        selector.modify(sock, selectors.EVENT_READ, job)
                if done is not None:
                    outcomes.append((job.key, *done))
                    selector.unregister(sock)
                    sock.close()
    finally:
        for item in list(selector.get_map().values()):
            # connected, no proof yet: the node is there, the rank says nothing
            outcomes.append((item.data.key, SILENT if item.data.challenge else UNREACHABLE,
                             None))
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
    """``(comm, ppid)`` of a process."""
    comm, fields = stat_fields(pid)
    return comm, int(fields[1])


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
