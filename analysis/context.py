"""Machine context of a run, and runs that shared a host at the same time.

A timing is only worth what the machine it ran on allowed: four ranks on two
cores share them, and two runs started side by side on one node slow each
other down. Every report table, sweep and figure therefore names the machine
(:func:`machine_context`, :func:`format_context`), and runs whose wall-clock
intervals intersect on a shared host are flagged (:func:`overlapping_runs`):
their timings are not comparable and no speedup or efficiency is computed from
them without that flag.

The numbers come from root attributes the training driver records
(``schema.CONTEXT_ATTRS``): ``host_cores`` (physical cores of rank 0's host),
``host_cpus`` (its logical CPUs), ``ranks_per_host`` (the most ranks on one
host), ``oversubscribed`` (some host runs more ranks than it has physical
cores), ``t_begin_unix`` / ``t_end_unix`` (the run's wall-clock interval, from
the start of its set-up, data loading included, to the end of its training and
last evaluation: another run's set-up loads the CPU too), and
``foreign_cpu_share`` (the share of the hosts' cores that processes outside
the run used during its training, :func:`foreign_cpu`; a run is
:func:`loaded` above :data:`LOADED_SHARE`), and on the GPU ``gpu_count``,
``ranks_per_gpu`` and ``gpu_shared`` (``schema.GPU_ATTRS``: ranks that share
one GPU time-slice it, which "not oversubscribed", a statement about cores,
does not say; the line names the GPUs from ``devices``). Files written
before these attributes existed give ``None`` for them, and are never flagged
as overlapping (nothing says when they ran). :func:`host_info` measures the
first two on the machine it is called on (Linux ``/sys`` topology, else
``os.cpu_count()``).

Only the standard library: no MPI, no NumPy, so the runner and the reports can
both import it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Keys of :func:`machine_context`, in the order :func:`format_context` uses them.
CONTEXT_KEYS: tuple[str, ...] = (
    "cores", "cpus", "smt", "world_size", "hosts", "ranks_per_host", "ranks_per_core",
    "oversubscribed", "slowdown_mode", "simulated", "loaded", "shared_machine",
    "gpus", "ranks_per_gpu", "gpu_shared",
)


def _number(value: Any) -> float | None:
    """A finite number from an attribute value, else None (absent, "", NaN)."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None or number < 1 else int(number)


def _flag(value: Any) -> bool | None:
    """A recorded bool (HDF5 may hand back numpy bools, ints or "True"/"False")."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        low = value.strip().lower()
        return True if low in ("true", "1", "yes") else False if low in (
            "false", "0", "no") else None
    try:
        return bool(value)
    except (TypeError, ValueError):
        return None


def _attrs_of(run: Any) -> Mapping[str, Any]:
    """Root attributes of a :class:`~syncbench.analysis.runfile.Run` or of a mapping."""
    attrs = getattr(run, "attrs", run)
    return attrs if isinstance(attrs, Mapping) else {}


def _hosts(attrs: Mapping[str, Any]) -> list[str]:
    value = attrs.get("hostnames")
    if isinstance(value, str):
        value = [value] if value else []
    return sorted({str(h) for h in value or () if str(h)})


def _slowdown_mode(attrs: Mapping[str, Any],
                   rank_attrs: Mapping[int, Mapping[str, Any]] | None) -> str | None:
    """The emulation mode that slowed ranks used: rank attrs, else the ``config`` flag."""
    modes = set()
    for a in (rank_attrs or {}).values():
        mode = a.get("slowdown_mode")
        slow = _number(a.get("slowdown"))
        if mode and mode != "none" and (slow is None or slow != 1.0):
            modes.add(str(mode))
    if modes:
        return "|".join(sorted(modes))
    if attrs.get("slowdown_mode"):
        return str(attrs["slowdown_mode"])
    config = attrs.get("config")
    if isinstance(config, Mapping) and config.get("slowdown") and config.get("slowdown_mode"):
        return str(config["slowdown_mode"])
    return None


def machine_context(attrs: Mapping[str, Any] | Any,
                    rank_attrs: Mapping[int, Mapping[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """The machine a run saw, from its root attributes (or a ``Run``).

    Keys (:data:`CONTEXT_KEYS`; ``None`` where the file does not say):
    ``cores`` / ``cpus`` (physical cores / logical CPUs of rank 0's host),
    ``smt`` (cpus > cores), ``world_size``, ``hosts`` (the nodes: root attr
    ``nodes``, else the distinct host names), ``ranks_per_host`` (the most
    ranks on one node: recorded, else world_size / hosts rounded up),
    ``ranks_per_core`` (the most ranks on one machine, ``ranks_per_machine``,
    else ranks_per_host, over cores: nodes of one kernel share its cores),
    ``shared_machine`` (several nodes on one machine: the emulated cluster),
    ``oversubscribed`` (recorded,
    per node against its own cores; else ranks_per_host > cores),
    ``slowdown_mode`` (the emulation mode of the slowed ranks: rank attrs
    ``slowdown_mode``, else the ``config`` flag; None without a slowdown),
    ``simulated`` (the root attr, False if absent) and ``loaded``
    (:func:`loaded`: other processes used more than :data:`LOADED_SHARE` of
    the hosts' cores during the run; None in older files) with
    ``foreign_cpu_share`` (that share; None when not recorded). GPU runs
    (``backend`` cupy) add ``gpus`` (``"1 GPU (NVIDIA H200)"``: the distinct GPUs,
    root attr ``gpu_count``, else the distinct ``devices``, and their names),
    ``ranks_per_gpu`` and ``gpu_shared`` (recorded, else ranks_per_gpu > 1); all
    three None on the CPU and in older files that do not say.
    ``rank_attrs`` defaults to the run's own when a ``Run`` is given.
    """
    if rank_attrs is None:
        rank_attrs = getattr(attrs, "rank_attrs", None)
    attrs = _attrs_of(attrs)
    cores = _int(attrs.get("host_cores"))
    cpus = _int(attrs.get("host_cpus"))
    world = _int(attrs.get("world_size"))
    hosts = _int(attrs.get("nodes")) or len(_hosts(attrs))
    per_host = _int(attrs.get("ranks_per_host"))
    if per_host is None and world is not None and hosts:
        per_host = -(-world // hosts)
    per_machine = _int(attrs.get("ranks_per_machine")) or per_host
    over = _flag(attrs.get("oversubscribed"))
    if over is None and per_machine is not None and cores is not None:
        over = per_machine > cores
    return {
        "cores": cores,
        "cpus": cpus,
        "smt": None if cores is None or cpus is None else cpus > cores,
        "world_size": world,
        "hosts": hosts or None,
        "ranks_per_host": per_host,
        "ranks_per_core": None if per_machine is None or cores is None
        else per_machine / cores,
        "shared_machine": per_machine is not None and per_host is not None
        and per_machine > per_host,
        "oversubscribed": over,
        "slowdown_mode": _slowdown_mode(attrs, rank_attrs),
        "simulated": bool(_flag(attrs.get("simulated"))),
        "loaded": loaded(attrs),
        "foreign_cpu_share": foreign_share(attrs),
        **gpu_context(attrs),
    }


def _devices(attrs: Mapping[str, Any]) -> list[str]:
    value = attrs.get("devices")
    if isinstance(value, str):
        value = [value] if value else []
    return [str(d) for d in value or () if str(d)]


def gpu_context(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``gpus``, ``ranks_per_gpu`` and ``gpu_shared`` of :func:`machine_context` (None
    for all three without a GPU)."""
    none = {"gpus": None, "ranks_per_gpu": None, "gpu_shared": None}
    devices = [d for d in _devices(attrs) if d.startswith("cuda")]
    if str(attrs.get("backend", "")) != "cupy" and not devices:
        return none
    # "cuda:0 NVIDIA H200" -> "NVIDIA H200"
    names = sorted({d.split(" ", 1)[1] if " " in d else d for d in devices})
    count = _int(attrs.get("gpu_count")) or len(devices) or None
    per_gpu = _int(attrs.get("ranks_per_gpu"))
    world = _int(attrs.get("world_size"))
    if per_gpu is None and count and world:
        per_gpu = -(-world // count)  # older files: the ranks spread evenly
    shared = _flag(attrs.get("gpu_shared"))
    if shared is None and per_gpu is not None:
        shared = per_gpu > 1
    label = (f"{_count(count, 'GPU')}" if count else "GPUs unknown") + (
        f" ({', '.join(names)})" if names else "")
    return {"gpus": label, "ranks_per_gpu": per_gpu, "gpu_shared": shared}


def _count(value: Any, noun: str) -> str:
    """``"2 cores"``, ``"1 host"``; a range string such as ``"1-4"`` takes the plural."""
    plural = not (isinstance(value, int | float) and value == 1)
    return f"{value:g} {noun}{'s' if plural else ''}" if isinstance(value, int | float) \
        else f"{value} {noun}s"


def format_context(ctx: Mapping[str, Any]) -> str:
    """One line, e.g. ``machine: 2 cores (2 CPUs), 4 ranks on 1 host, 2.0 ranks/core,
    oversubscribed, slowdown mode work``; unknown parts say so.

    A multi-node run says ``on N nodes (R ranks/node)`` (R the most on one node)
    and its cores ``per node`` (rank 0's node), or ``per machine`` when nodes
    share one (the emulated cluster); ranks/core is per machine.
    Values may also be the range strings of :func:`merge_contexts` (``"1-4"``:
    nodes then too).
    """
    parts = []
    cores, cpus = ctx.get("cores"), ctx.get("cpus")
    world, hosts = ctx.get("world_size"), ctx.get("hosts")
    nodes = hosts is not None and hosts != 1  # a number > 1 or a range: say nodes
    if cores is None:
        parts.append("cores unknown")
    else:
        parts.append(_count(cores, "core")
                     + (f" ({_count(cpus, 'CPU')})" if cpus is not None else "")
                     + ((" per machine, shared by the nodes" if ctx.get("shared_machine")
                         else " per node") if nodes else ""))
    if world is not None:
        where = ""
        if hosts == 1:
            where = " on 1 host"
        elif nodes:
            per = ctx.get("ranks_per_host")
            where = f" on {_count(hosts, 'node')}" + (
                f" ({_count(per, 'rank')}/node)" if per is not None else "")
        parts.append(_count(world, "rank") + where)
    rpc = ctx.get("ranks_per_core")
    if rpc is not None:
        parts.append(f"{rpc:.1f} ranks/core" if isinstance(rpc, int | float)
                     else f"{rpc} ranks/core")
    over = ctx.get("oversubscribed")
    parts.append("oversubscribed" if over is True else "not oversubscribed" if over is False
                 else str(over) if over else "oversubscription unknown")
    if ctx.get("gpus"):
        rpg = ctx.get("ranks_per_gpu")
        part = str(ctx["gpus"]) + (f", {_count(rpg, 'rank')}/GPU" if rpg is not None else "")
        shared = ctx.get("gpu_shared")
        parts.append(part + (", GPU SHARED (ranks time-slice one GPU)" if shared is True
                             else f", {shared}" if isinstance(shared, str) else ""))
    if ctx.get("slowdown_mode"):
        parts.append(f"slowdown mode {ctx['slowdown_mode']}")
    if ctx.get("simulated"):
        parts.append("simulated")
    if ctx.get("loaded"):
        share = ctx.get("foreign_cpu_share")
        parts.append((f"LOADED ({loaded_text(share)})" if isinstance(share, float)
                      else "LOADED (other processes used the cores)")
                     if ctx["loaded"] is True else str(ctx["loaded"]))
    return "machine: " + ", ".join(parts)


def loaded_text(share: float) -> str:
    """``"other processes used 45% of the cores during the run"``."""
    return f"other processes used {100 * share:.0f}% of the cores during the run"


def merge_contexts(contexts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One context for several runs, for a table or figure that shows them all.

    Equal values are kept; numbers that differ become a range string
    (``"1-4"``, ranks per core with one decimal); ``oversubscribed`` is True
    or False when all runs agree, else ``"some oversubscribed"``;
    ``slowdown_mode`` joins the distinct modes; ``smt`` and ``simulated`` are
    True if any run's is.
    """
    out: dict[str, Any] = {}
    for key in CONTEXT_KEYS:
        known = [c.get(key) for c in contexts if c.get(key) is not None]
        distinct = list(dict.fromkeys(known))
        if key == "oversubscribed":
            out[key] = (distinct[0] if len(distinct) == 1 else
                        "some oversubscribed" if distinct else None)
            if len(distinct) == 1 and len(known) < len(contexts) and distinct[0]:
                out[key] = "some oversubscribed"
        elif key == "loaded":
            out[key] = (None if not known else True if all(known) else
                        "some runs loaded" if any(known) else False)
        elif key in ("smt", "simulated", "shared_machine"):
            out[key] = any(known) if known else (False if key == "simulated" else None)
        elif key == "gpu_shared":
            out[key] = (None if not known else True if all(known) else
                        "some GPUs shared" if any(known) else False)
        elif key == "gpus":
            out[key] = " | ".join(str(v) for v in distinct) or None
        elif key == "slowdown_mode":
            modes = sorted({m for v in distinct for m in str(v).split("|")})
            out[key] = "|".join(modes) or None
        elif len(distinct) <= 1:
            out[key] = distinct[0] if distinct else None
        elif key == "ranks_per_core":
            out[key] = f"{min(distinct):.1f}-{max(distinct):.1f}"
        else:
            out[key] = f"{min(distinct):g}-{max(distinct):g}"
    shares = [c["foreign_cpu_share"] for c in contexts
              if c.get("loaded") is True and isinstance(c.get("foreign_cpu_share"), float)]
    out["foreign_cpu_share"] = max(shares) if shares else None  # the worst loaded run
    return out


def format_contexts(contexts: Sequence[Mapping[str, Any]]) -> str:
    """:func:`format_context` of several runs (ranges where they differ)."""
    if not contexts:
        return "machine: unknown"
    return format_context(merge_contexts(contexts))


def context_line(runs: Sequence[Any]) -> str:
    """The machine line of several runs (or their root attribute mappings): the
    :func:`format_contexts` of their :func:`machine_context`, for reports and plots."""
    return format_contexts([machine_context(run) for run in runs])


def run_interval(run: Any) -> tuple[float, float] | None:
    """``(t_begin_unix, t_end_unix)`` of a run (or root attributes); None if unrecorded."""
    attrs = _attrs_of(run)
    begin, end = _number(attrs.get("t_begin_unix")), _number(attrs.get("t_end_unix"))
    if begin is None or end is None or end < begin:
        return None
    return begin, end


def overlapping_runs(runs: Sequence[Any]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, of runs that ran on a shared host at the same time.

    ``runs`` are :class:`~syncbench.analysis.runfile.Run` objects or their root
    attribute mappings. Two runs overlap when their ``hostnames`` share a name
    and their closed intervals ``[t_begin_unix, t_end_unix]`` intersect. Runs
    without both times (older files) or without host names are never paired.
    """
    info = []
    for run in runs:
        attrs = _attrs_of(run)
        info.append((set(_hosts(attrs)), run_interval(attrs)))
    pairs = []
    for i, (hosts_i, span_i) in enumerate(info):
        if span_i is None or not hosts_i:
            continue
        for j in range(i + 1, len(info)):
            hosts_j, span_j = info[j]
            if span_j is None or not hosts_i & hosts_j:
                continue
            if span_i[0] <= span_j[1] and span_j[0] <= span_i[1]:
                pairs.append((i, j))
    return pairs


_CPU_ROOT = Path("/sys/devices/system/cpu")


def _online_cpus(root: Path | None = None) -> list[int] | None:
    """Every online logical CPU of the host (``/sys/.../cpu/online``), not this process's mask."""
    root = _CPU_ROOT if root is None else root
    try:
        text = (root / "online").read_text().strip()
    except OSError:
        return None
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            return None
    return cpus or None


def _physical_cores(root: Path | None = None) -> int | None:
    """Distinct (package, core) pairs over every online CPU of the host (Linux ``/sys``).

    The host's count, not the CPUs this process may run on: under core binding
    (Open MPI binds ranks to cores at up to 2 ranks) each rank's affinity mask
    holds one core, and counting that would call every host oversubscribed.
    """
    root = _CPU_ROOT if root is None else root
    cpus = _online_cpus(root)
    if cpus is None:
        return None
    pairs = set()
    for cpu in cpus:
        topo = root / f"cpu{cpu}" / "topology"
        try:
            core = (topo / "core_id").read_text().strip()
            package = (topo / "physical_package_id").read_text().strip()
        except OSError:
            return None
        pairs.add((package, core))
    return len(pairs) or None


def host_info() -> dict[str, Any]:
    """This host: ``host_cores`` (physical cores) and ``host_cpus`` (logical CPUs).

    The cores and CPUs are the host's (every online CPU), not this process's
    affinity mask, so that every rank of a host reports the same counts
    whatever binding the launcher chose; ``host_cores`` is None where the
    topology is not readable, and then :func:`machine_context` reports it as
    unknown. The load average is :func:`load_average`'s, read where it is needed.
    """
    online = _online_cpus()
    cpus = len(online) if online else os.cpu_count()
    return {"host_cores": _physical_cores(), "host_cpus": cpus, "machine": machine_id()}


def machine_key(host: str, machine: str | None) -> str:
    """What ranks share cores and ``/proc/stat`` on: the kernel's boot id
    (``host_info``'s ``machine``), else the host name (older files, no ``/proc``)."""
    return str(machine or host)


def machine_id() -> str:
    """The kernel this process runs on (``/proc/sys/kernel/random/boot_id``), "" if unknown.

    Nodes that are namespaces of one host (the emulated cluster) have their own
    host names but one kernel, one ``/proc/stat``: :func:`foreign_cpu` counts
    their CPU time once, per kernel, not once per host name.
    """
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


#: Environment variables with these prefixes select MPI transports (UCX, MPICH's
#: control variables and their ``MPICH_`` aliases, libfabric, Open MPI and its
#: launcher PRRTE, Intel MPI): the root attribute ``mpi_transport_env``.
TRANSPORT_PREFIXES: tuple[str, ...] = (
    "UCX_", "MPIR_CVAR_", "MPICH_", "FI_", "OMPI_MCA_", "PRTE_MCA_", "I_MPI_",
)
#: What Open MPI's launcher sets for every process (bookkeeping, not a choice).
_LAUNCHER_SET = frozenset({"OMPI_MCA_PREFIXES", "OMPI_MCA_num_procs", "OMPI_MCA_initial_wdir",
                           "OMPI_MCA_cpu_type", "OMPI_MCA_num_restarts"})


def transport_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's MPI transport settings: ``environ``'s :data:`TRANSPORT_PREFIXES`
    variables (``os.environ`` by default), the launcher's own bookkeeping left out."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if k.startswith(TRANSPORT_PREFIXES) and k not in _LAUNCHER_SET}


def merge_transport_env(per_rank: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """One mapping of every rank's :func:`transport_env` (``schema.TRANSPORT_ATTR``).

    A variable every rank saw with one value maps to that value; one that
    differs between ranks (or is unset on some) maps to the per-rank list,
    None where unset.
    """
    names = sorted({k for env in per_rank for k in env})
    out: dict[str, Any] = {}
    for name in names:
        values = [env.get(name) for env in per_rank]
        out[name] = values[0] if len(set(values)) == 1 else values
    return out


def load_average() -> float | None:
    """The host's 1-minute load average (``os.getloadavg()[0]``); None where unavailable."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def loaded(attrs: Mapping[str, Any] | Any) -> bool | None:
    """True when other processes used more than :data:`LOADED_SHARE` of the cores during the run.

    Reads the root attribute ``foreign_cpu_share`` (``schema.CPU_ATTRS``,
    :func:`foreign_cpu`): the busy CPU time of the run's hosts during training
    (``/proc/stat``) less the CPU time of the run's own ranks, over the
    training wall time times the hosts' physical cores. Unlike the 1-minute
    load average (``load_begin`` / ``load_end``, kept as information) it
    neither lags by a minute nor counts the run's own ranks or the run before
    it. None when the file does not record the share (older files: no flag,
    the load-average rule is not applied) or recorded NaN (no ``/proc/stat``).
    """
    share = foreign_share(attrs)
    return None if share is None else share > LOADED_SHARE


def foreign_share(attrs: Mapping[str, Any] | Any) -> float | None:
    """The recorded ``foreign_cpu_share`` of a run (or root attributes); None if absent or NaN."""
    return _number(_attrs_of(attrs).get("foreign_cpu_share"))


#: ``foreign_cpu_share`` above which a run is "loaded". A quiet host's daemons, the
#: launcher and the kernel's own threads take a few percent of its cores; one
#: competing single-threaded process takes 1 / cores of them (50 % of 2 cores, 6 % of
#: 16). A tenth of the cores' time taken by others is several times the quiet
#: level, and enough to stretch the steps of a run that uses every core by about as
#: much, beyond the run-to-run spread of a quiet machine.
LOADED_SHARE = 0.10

#: ``/proc/stat`` fields of a CPU's time it did not run anything: idle, iowait.
_IDLE_FIELDS = (3, 4)


def host_cpu_idle_s(path: str = "/proc/stat") -> dict[str, float] | None:
    """Each CPU's idle seconds since boot (idle + iowait of the ``cpuN`` lines of Linux
    ``/proc/stat``, clock ticks over ``os.sysconf("SC_CLK_TCK")``); None elsewhere.

    A host's busy time over an interval is then, per CPU, the interval less its idle
    time (:func:`foreign_cpu`), not the sum of the busy fields (user, system, ...): the
    kernel samples those at the tick, and on a CPU whose cgroup is at a CFS quota the
    ticks counted user time no process used. On the emulated cluster (a KVM guest on an
    Intel Xeon, Linux 6.18.44, HZ 250, a node at speed 0.5) one CPU's user + system +
    idle came to 22.9 s over a run of 16.8 s, 5.4 s of user time more than its wall, and
    a run on a quiet host read a foreign share of 0.33; idle, which the kernel measures
    at idle entry and exit, not by ticks, kept within the wall (docs/RESULTS.md, "A
    quota and the host's busy time")."""
    try:
        ticks = float(os.sysconf("SC_CLK_TCK"))
        idle: dict[str, float] = {}
        with open(path) as f:
            for line in f:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu":
                    continue
                values = [int(v) for v in fields[1:]]
                idle[fields[0]] = sum(values[i] for i in _IDLE_FIELDS if i < len(values)) / ticks
        return idle if idle and ticks > 0 else None
    except (OSError, ValueError, AttributeError):
        return None


def busy_between(begin: Mapping[str, float], end: Mapping[str, float],
                 seconds: float) -> float:
    """CPU seconds the host's CPUs were not idle over ``seconds`` of wall, from
    :func:`host_cpu_idle_s` at its two ends: per CPU present at both, the wall less its
    idle time, within 0 and the wall (a CPU the kernel took off line is left out)."""
    return sum(min(seconds, max(0.0, seconds - (end[cpu] - begin[cpu])))
               for cpu in begin.keys() & end.keys())


def process_cpu_s() -> float:
    """User + system CPU seconds of this process, every thread included (``getrusage``)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_sample(read_host: bool) -> dict[str, Any]:
    """One rank's CPU accounting at a point of the run (the start barrier, the end of training).

    ``own_s``: this process's CPU seconds; ``host_idle_s``: each of the host's CPUs'
    idle seconds (:func:`host_cpu_idle_s`; read only when ``read_host``: the host's
    first rank; None otherwise or where ``/proc/stat`` is missing); ``t``:
    ``time.monotonic()``.
    """
    import time

    try:
        own: float | None = process_cpu_s()
    except (ImportError, OSError):
        own = None
    return {"own_s": own, "host_idle_s": host_cpu_idle_s() if read_host else None,
            "t": time.monotonic()}


def foreign_cpu(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Root attributes ``foreign_cpu_s`` and ``foreign_cpu_share`` from every rank's samples.

    ``records`` has one entry per rank: ``host`` (name; ``machine``, the kernel's
    boot id, groups instead where given), ``cores`` (the host's
    physical cores), ``begin`` / ``end`` (:func:`cpu_sample` at the start
    barrier and at the end of training). Per host, the busy CPU time between
    its first rank's two samples (:func:`busy_between`: each CPU's wall less its
    idle time) less the CPU time all its ranks used in theirs is the time other
    processes took (clipped at 0: clock-tick rounding); ``foreign_cpu_s`` sums it
    over the hosts, and
    ``foreign_cpu_share`` divides it by the sum over hosts of that interval's
    wall seconds times the host's cores. NaN for both when some host has no
    reading (no ``/proc/stat``, unknown cores).
    """
    nan = {"foreign_cpu_s": math.nan, "foreign_cpu_share": math.nan}
    hosts: dict[str, dict[str, float]] = {}
    for rec in records:
        # one kernel, one /proc/stat: nodes that are namespaces of one host count once
        h = hosts.setdefault(machine_key(rec["host"], rec.get("machine")), {"own": 0.0})
        begin, end = rec["begin"], rec["end"]
        if begin.get("own_s") is None or end.get("own_s") is None:
            return nan
        h["own"] += end["own_s"] - begin["own_s"]
        if ("busy" not in h and begin.get("host_idle_s") is not None
                and end.get("host_idle_s") is not None):
            wall = end["t"] - begin["t"]
            h["busy"] = busy_between(begin["host_idle_s"], end["host_idle_s"], wall)
            h["capacity"] = wall * float(rec.get("cores") or 0)
    if not hosts or any("busy" not in h or not h["capacity"] > 0 for h in hosts.values()):
        return nan
    foreign = sum(max(0.0, h["busy"] - h["own"]) for h in hosts.values())
    return {"foreign_cpu_s": foreign,
            "foreign_cpu_share": foreign / sum(h["capacity"] for h in hosts.values())}
