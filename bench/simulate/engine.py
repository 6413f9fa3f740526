"""Loading SimGrid, and the flow oracle that times one communication phase.

SimGrid's Python bindings come from Debian's ``python3-simgrid`` (``make
sim`` links that one module into the venv) or from the ``simgrid`` sdist on
PyPI (``pip install 'syncbench[sim]'``). Actors run on thread contexts (the
bindings' default); ``contexts/factory:ucontext`` crashes them, so it is
never set.

A SimGrid engine is a process-wide singleton that runs once, so a whole
simulation (or a whole validation table) runs inside ONE driver actor:
:func:`run_in_simgrid` loads the platform, starts the actor and calls the
given function with a :class:`Network`. ``Network.phase`` starts one flow
per (source, destination) pair with ``Comm.sendto_async`` (no mailboxes, no
per-rank actors, which is what makes 16,384 ranks tractable), waits for all of
them, and returns the simulated time the phase took. On an otherwise idle network a phase always
takes the same time, so durations are cached by the phase's description.

Network model: CM02 (max-min fair sharing, latency + size / bandwidth per
flow, no TCP correction factors) without cross-traffic and without the TCP
window cap, so a flow of S bytes over a route of latency L and bottleneck
bandwidth B takes exactly L + S/B alone: the parameters a user gives (or
``--calibrate`` fits) are the ones the simulation uses. SimGrid bounds every
flow's rate by ``network/TCP-gamma`` / (2 L) (``src/surf/network_cm02.cpp``,
``NetworkCm02Model::comm_action_set_variable``; default 4 MiB, the largest
TCP window), far below the links' rate at high latency (docs/RESULTS.md,
"SimGrid's TCP window bound"). ``network/TCP-gamma:0`` turns the bound off: in SimGrid 3.32
the bound is then 0, and the max-min solver bounds only variables with a
bound > 0 (``src/kernel/lmm/maxmin.cpp``); later releases document 0 as
"disable the TCP windowing mechanism" (``docs/source/Configuring_SimGrid.rst``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from syncbench.bench.files import write_atomic

#: How to get SimGrid, for the one-line error when it is missing.
INSTALL_HINT = (
    "SimGrid's Python module is not installed: run 'make sim' (Debian: apt-get install "
    "python3-simgrid, linked into the venv) or pip install 'syncbench[sim]'"
)

#: SimGrid configuration of every simulation (see the module docstring).
SIMGRID_CONFIG: tuple[str, ...] = (
    "--log=root.thres:critical",
    "--log=xbt_cfg.thres:critical",
    "--cfg=network/model:CM02",
    "--cfg=network/crosstraffic:0",
    "--cfg=network/TCP-gamma:0",
)


class SimGridMissing(RuntimeError):
    """SimGrid's Python module cannot be imported."""


def load_simgrid() -> Any:
    """The ``simgrid`` module, quietly (its import logs the context factory to stderr)."""
    if sys.modules.get("simgrid") is not None:
        return sys.modules["simgrid"]
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                import simgrid  # lazy: SimGrid is optional (make sim), errors silenced
            except ImportError as exc:
                raise SimGridMissing(INSTALL_HINT) from exc
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return simgrid


def have_simgrid() -> bool:
    """True when SimGrid's Python module can be imported."""
    try:
        load_simgrid()
    except SimGridMissing:
        return False
    return True


class Network:
    """Times communication phases on the loaded platform (inside the driver actor)."""

    def __init__(self, sg: Any, hosts: Sequence[Any], ranks_per_host: int = 1,
                 known: dict[str, float] | None = None) -> None:
        self.sg = sg
        self.hosts = list(hosts)
        self.ranks_per_host = max(1, int(ranks_per_host))
        #: Durations of the phases simulated on this platform, by repr((key, nbytes)):
        #: here, or earlier (``--phase-cache``, which stores this dict back).
        self.known = dict(known or {})
        self.flows = 0  # flows simulated (the simulator's events)
        self.phases = 0  # distinct phases simulated

    @property
    def capacity(self) -> int:
        """How many ranks the platform can place."""
        return len(self.hosts) * self.ranks_per_host

    def host_of(self, rank: int) -> Any:
        return self.hosts[rank // self.ranks_per_host]

    def phase(self, key: Hashable, pairs: Callable[[], Sequence[tuple[int, int]]],
              nbytes: float) -> float:
        """Simulated seconds of one phase: every pair sends ``nbytes`` at once.

        ``key`` describes the phase (e.g. ``("xor", 4, 1024)``): an idle
        network gives the same duration for the same phase, so it is cached.
        """
        if nbytes <= 0:
            return 0.0
        full_key = repr((key, float(nbytes)))
        if full_key in self.known:
            return self.known[full_key]
        flows = [(s, d) for s, d in pairs() if s != d]
        if not flows:  # no pair crosses ranks: nothing to send (never stored in the cache)
            return 0.0
        sg = self.sg
        size = max(1, int(round(nbytes)))
        hosts, per_host, send = self.hosts, self.ranks_per_host, sg.Comm.sendto_async
        start = sg.Engine.clock
        comms = [send(hosts[s // per_host], hosts[d // per_host], size) for s, d in flows]
        wait_all_ended(comms)
        seconds = sg.Engine.clock - start
        self.flows += len(flows)
        self.phases += 1
        self.known[full_key] = seconds
        return seconds


def wait_all_ended(comms: Sequence[Any]) -> None:
    """Return when every comm of ``comms`` has ended, the clock at the last one's end.

    ``Comm.wait_all`` waits for each comm in turn (``src/s4u/s4u_Comm.cpp``: a
    loop of ``comm->wait()``), one simcall each, ended or not: a context switch
    to the maestro and back per flow, which on a loaded host costs more than the
    simulation of the flow. A comm's ``finish_time`` is the kernel's
    (``ActivityImpl::finish_time_``, -1 until the engine ends it:
    ``EngineImpl::handle_ended_actions``), read without a simcall, so only a
    comm still running is waited for; the others ended on the way. Every comm
    ended at or before the clock at which the last waited one did, so the clock
    is the phase's end, as with ``wait_all``.
    """
    for comm in comms:
        if comm.finish_time < 0:
            comm.wait()


def load_phase_cache(path: str | None, platform_xml: str, ranks_per_host: int
                     ) -> dict[str, float]:
    """Durations stored by earlier runs on the same platform (else empty)."""
    doc = _read_cache(path)
    phases = doc.get(_platform_digest(platform_xml, ranks_per_host), {})
    return {str(k): float(v) for k, v in phases.items()}


def save_phase_cache(path: str | None, platform_xml: str, ranks_per_host: int,
                     network: Network) -> None:
    """Add ``network``'s phase durations under its platform (``write_atomic``: a temporary
    name nobody can predict, then a rename; ``WriteError`` naming ``path``)."""
    if not path:
        return
    doc = _read_cache(path)
    doc[_platform_digest(platform_xml, ranks_per_host)] = network.known
    write_atomic(path, json.dumps(doc).encode())


def _read_cache(path: str | None) -> dict[str, Any]:
    """platform digest -> {repr(phase key): seconds}; empty if absent or unreadable."""
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _platform_digest(platform_xml: str, ranks_per_host: int) -> str:
    text = f"{ranks_per_host}\n{platform_xml}\n{' '.join(SIMGRID_CONFIG)}"
    return hashlib.sha256(text.encode()).hexdigest()


def run_in_simgrid(platform_xml: str, body: Callable[[Network], Any],
                   ranks_per_host: int = 1, host_order: Callable[[str], Any] | None = None,
                   phase_cache: str | None = None) -> tuple[Any, Network, float]:
    """Load ``platform_xml`` (XML text), run ``body(network)`` in one driver actor.

    Returns ``(body's result, the network, wall seconds)``. An exception in
    ``body`` is re-raised here, after the engine stops. ``phase_cache``: a
    JSON file of phase durations, read before and written after (only
    entries of the same platform are used), so sweeps do not simulate the
    same phase twice.
    """
    sg = load_simgrid()
    wall0 = time.perf_counter()
    engine = sg.Engine(["syncbench", *SIMGRID_CONFIG])
    with tempfile.TemporaryDirectory(prefix="syncbench-sim-") as tmp:
        path = os.path.join(tmp, "platform.xml")
        with open(path, "w") as f:
            f.write(platform_xml)
        engine.load_platform(path)
    hosts = list(engine.all_hosts)
    hosts.sort(key=(lambda h: host_order(h.name)) if host_order else (lambda h: h.name))
    network = Network(sg, hosts, ranks_per_host,
                      load_phase_cache(phase_cache, platform_xml, ranks_per_host))
    outcome: dict[str, Any] = {}

    def driver() -> None:
        try:
            outcome["result"] = body(network)
        except BaseException as exc:  # re-raised outside the engine
            outcome["error"] = exc

    sg.Actor.create("driver", hosts[0], driver)
    engine.run()
    if "error" in outcome:
        raise outcome["error"]
    save_phase_cache(phase_cache, platform_xml, ranks_per_host, network)
    return outcome.get("result"), network, time.perf_counter() - wall0
