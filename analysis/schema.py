"""Names of the ``syncbench/1`` run-file schema, defined once.

The recorder (``syncbench.bench.train.recorder``) writes these names and the
analysis readers read them; nothing else spells them out. Every dataset's unit
and one-line description are here too (``DATASET_INFO``), written beside it as
the ``units`` and ``description`` attributes (the attribute names of the
NetCDF / CF conventions), so a file explains itself to h5dump or HDFView.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from syncbench.algorithms.traits import (  # noqa: F401 (the schema's names)
    LOCAL_FIRST_ORDER,
    LOCK_STEP_ORDER,
    PHASES,
    StrategyTraits,
)

SCHEMA = "syncbench/1"

#: Root attributes of every run file.
ROOT_ATTRS: tuple[str, ...] = (
    "schema",
    "algorithm",
    "model",
    "dataset",
    "world_size",
    "config",
    "started_utc",
    "syncbench_version",
    "git_sha",
    "mpi_library",
    "mpi4py_version",
    "numpy_version",
    "cupy_version",
    # the CuPy distribution: cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13)
    "cupy_package",
    "h5py_version",
    "backend",
    "devices",
    "cuda_aware",
    "slurm_job_id",
    "hostnames",
    # machine context and scaling study (see CONTEXT_ATTRS, SCALING_MODE_ATTR)
    "host_cores",
    "host_cpus",
    "ranks_per_host",
    "oversubscribed",
    "t_begin_unix",
    "t_end_unix",
    # the GPUs of the run and the ranks sharing one (see GPU_ATTRS)
    "gpu_count",
    "ranks_per_gpu",
    "gpu_shared",
    "scaling_mode",
    # leading warm-up steps per rank (OD-SGD's plain SSGD steps; 0 otherwise)
    "warmup_steps",
    # SSGD: gradient reductions posted per step (Iallreduce buckets with --comm
    # overlap, 1 with blocking); 0 for the other algorithms
    "buckets",
    # D-PSGD: the graph's spectral gap, 1 - ||W - 11^T/N||_2 (of the cycle's product for a
    # time-varying graph), and the consensus distance (1/N) sum_i ||x_i - x_bar||^2 at each
    # evaluation (consensus_samples: its global samples, as /eval's samples_seen)
    "spectral_gap",
    "consensus_samples",
    "consensus_distance",
    # D-PSGD, AD-PSGD: at each evaluation (consensus_samples), the mean and the worst
    # over the ranks of each rank's own model's test accuracy (the evaluated model is x_bar)
    "replica_accuracy_mean",
    "replica_accuracy_worst",
    # bytes one rank hands to MPI per step: the gradient buffer of SSGD's reducer
    # (--compress included) and OD-SGD's delayed reduction, D-PSGD's neighbour-allgather
    # buffer (its model or its gossip code), AD-PSGD's Get and Put (mean over ranks),
    # ASGD's pull and push (and DC's read of W_now); 0 where no part declares them
    "wire_bytes_per_step",
    # a strategy of rounds (Local SGD, SlowMo, DiLoCo, hierarchical, Oscars): bytes one
    # rank hands to MPI per round (DiLoCo: per outer step, every fragment synced once;
    # codes with --quantize; hierarchical: per global period, its node averages included)
    # and the local steps a round takes (Oscars: a rank's mean, its rounds differ; see
    # ROUND_ATTRS); DiLoCo's bytes per fragment
    "wire_bytes_per_outer_step",
    "outer_period_steps",
    "wire_bytes_per_fragment",
    # ASGD: JSON of the pulls' and pushes' latencies over every rank (p50, p90 and max,
    # ms), the pushes, and the staleness's mean and max and their lower bounds': the
    # run's `asgd:` line (see ASGD_REPORT_ATTR)
    "asgd_report",
    # 1-minute load average of rank 0's host at the start and end of the run
    # (os.getloadavg; information only, see CPU_ATTRS for the "loaded" flag)
    "load_begin",
    "load_end",
    # CPU seconds other processes used on the run's hosts during training, and
    # their share of the hosts' cores (see CPU_ATTRS)
    "foreign_cpu_s",
    "foreign_cpu_share",
    # JSON lists of config keys: the run's own strategy's options, and every
    # registered strategy's options (see STRATEGY_FLAGS_ATTRS)
    "strategy_flags",
    "option_flags",
    # JSON of the run's strategy's StrategyTraits (TRAITS_ATTR)
    "strategy_traits",
    # times the run was continued with --resume (see RESUMES_ATTR)
    "resumes",
    # nodes of the run and the ranks on each (see NODE_ATTRS), and the environment
    # variables that select MPI transports (see TRANSPORT_ATTR)
    "nodes",
    "ranks_per_node",
    "mpi_transport_env",
    # the most ranks on one machine (one kernel: the emulated cluster's nodes are one)
    "ranks_per_machine",
    # what the environment gave the run (ENVIRONMENT_ATTR) and the BLAS/OpenMP threads
    # of each rank (THREADS_ATTR)
    "environment",
    "threads_per_rank",
    # the data the run read: where from, and a hash of it (see DATA_ATTRS)
    "data_source",
    "data_sha256",
    "data_files",
    "data_generator",
)

#: Root attributes with the host's 1-minute load average at the start and the end of
#: the run (information only: it lags by a minute and counts the run's own ranks;
#: the "loaded" flag reads CPU_ATTRS).
LOAD_ATTRS: tuple[str, ...] = ("load_begin", "load_end")

#: Root attributes of the CPU accounting of a run (``syncbench.analysis.context``):
#: each host's busy CPU time (per CPU of ``/proc/stat``, the wall less its idle and
#: iowait time; before 2026-12-07 the sum of user + nice + system + irq + softirq +
#: steal, which the tick over-counts on a CPU at a CFS quota) between the start
#: barrier and the end of training, less the CPU time
#: (``getrusage``, threads included) the run's own ranks used there, summed over the
#: hosts (``foreign_cpu_s``), and that over wall seconds x the hosts' physical cores
#: (``foreign_cpu_share``). Above ``context.LOADED_SHARE`` the run is "loaded". NaN
#: where ``/proc/stat`` is missing; absent from older files (no "loaded" flag).
CPU_ATTRS: tuple[str, ...] = ("foreign_cpu_s", "foreign_cpu_share")

#: Root attributes naming ``config`` keys (JSON lists): ``strategy_flags``, the
#: fields of the run's strategy's ``Options``; ``option_flags``, those of every
#: registered strategy. A series' identity (``analysis.tables.series_identity``)
#: keeps the shared train flags and the strategy's own ones, not another strategy's
#: defaults. Absent from older files: every flag counts.
STRATEGY_FLAGS_ATTRS: tuple[str, ...] = ("strategy_flags", "option_flags")

#: Root attributes that describe the machine a run saw and when it ran
#: (``syncbench.analysis.context``): physical cores and logical CPUs of rank 0's
#: host, the most ranks on one host, whether a host ran more ranks than physical
#: cores, and the run's wall-clock interval (Unix seconds, from the start of its
#: set-up, data loading included, to the end of its training and last evaluation)
#: for overlap detection: a run that shares a host with another one's set-up or
#: training is not timed alone.
CONTEXT_ATTRS: tuple[str, ...] = (
    "host_cores", "host_cpus", "ranks_per_host", "oversubscribed", "t_begin_unix", "t_end_unix",
)

#: Root attributes of a run's GPUs: ``gpu_count``, the distinct GPUs its ranks computed
#: on (a GPU is one ``Backend.device_id``, its PCI bus id, on one machine; 0 on the
#: CPU), ``ranks_per_gpu``, the most ranks on one of them (0 on the CPU), and
#: ``gpu_shared``, whether some GPU computed for several ranks (they time-slice it,
#: however many cores the host has). Absent from older files and simulations.
GPU_ATTRS: tuple[str, ...] = ("gpu_count", "ranks_per_gpu", "gpu_shared")

#: Root attributes of a run's nodes: ``nodes``, the number of nodes (a node is a
#: host name: the ``hostname`` rank attribute), and ``ranks_per_node``, the ranks on
#: each (integers, in the order of the sorted ``hostnames`` attribute; rank attribute
#: ``node`` indexes both). Absent from older files: readers count ``hostnames``.
NODE_ATTRS: tuple[str, ...] = ("nodes", "ranks_per_node")

#: Root attribute: the most ranks on one machine (one kernel, ``host_info``'s boot
#: id: the emulated cluster's nodes are namespaces of one host and share its cores),
#: what ranks per core and ``oversubscribed`` count against ``host_cores``. Absent
#: from older files: readers use ``ranks_per_host``.
MACHINE_ATTR = "ranks_per_machine"

#: Root attribute: JSON object of the environment variables that select MPI transports
#: as the ranks saw them (names starting with ``analysis.context.TRANSPORT_PREFIXES``:
#: ``UCX_``, ``MPIR_CVAR_``, ``MPICH_``, ``FI_``, ``OMPI_MCA_``, ``PRTE_MCA_``, ``I_MPI_``;
#: the launcher's own ``OMPI_MCA_`` bookkeeping left out). A name every rank saw with one
#: value maps to it; a name whose value differs between ranks maps to a list, one entry
#: per rank (null where unset). ``{}`` when none is set.
TRANSPORT_ATTR = "mpi_transport_env"

#: Root attribute: JSON object of what the environment gave the run, the facts that
#: ``syncbench env`` prints (``{name: {"value": ..., "how": ...}}``): the MPI library
#: loaded (its path, version, vendor, the MPI wheels installed), mpi4py, CUDA awareness
#: and why, the device, the dataset's source, SimGrid, Slurm, the emulated cluster,
#: PyTorch, and the threads (with what the loaded OpenBLAS reports). Rank 0's view.
#: Absent from older files.
ENVIRONMENT_ATTR = "environment"

#: Root attribute: BLAS/OpenMP threads per rank (rank 0's): the user's OMP_NUM_THREADS
#: (or OPENBLAS_NUM_THREADS...), else what ``syncbench train`` set, its node's cores over
#: the ranks there; 0 where left to the libraries. Absent from older files.
THREADS_ATTR = "threads_per_rank"

#: Root attributes of the data a run read (``syncbench.bench.data.provenance``, rank 0):
#: ``data_source``, the folder its files came from (resolved), or ``"generated"``;
#: ``data_sha256``, SHA-256 over the bytes of the files read, one after the other in the
#: catalog's order (as stored: a gzipped file's compressed bytes), or for generated data
#: over its arrays (train images, train labels, test images, test labels; C order);
#: ``data_files`` (file datasets), JSON list of ``{"name", "bytes", "sha256"}`` per file
#: in that order; ``data_generator`` (generated data), JSON of the generator's name and
#: arguments (sizes, shape, classes, seed). Absent from older files and simulations:
#: readers take the data as not recorded.
DATA_SOURCE_ATTR = "data_source"
DATA_SHA256_ATTR = "data_sha256"
DATA_FILES_ATTR = "data_files"
DATA_GENERATOR_ATTR = "data_generator"
DATA_ATTRS: tuple[str, ...] = (DATA_SOURCE_ATTR, DATA_SHA256_ATTR, DATA_FILES_ATTR,
                               DATA_GENERATOR_ATTR)

#: Root attribute: "strong" or "weak" when the run belongs to a scaling study
#: (``syncbench train --scaling-mode``, set by ``syncbench sweep``); absent or
#: "" otherwise, and the report then infers the kind from the sample counts.
SCALING_MODE_ATTR = "scaling_mode"

#: Group of every rank's rows and attributes: one sub-group per rank, named by
#: :func:`rank_group` (the groups layout), or one dataset per column across ranks
#: (the packed layout, :data:`RANK_LAYOUT_ATTR`).
RANKS_GROUP = "ranks"

#: Root attribute (str): how ``/ranks`` stores the ranks. ``"packed"``
#: (:data:`RANK_LAYOUT_PACKED`, what the recorder and the simulator write): one 1-D
#: dataset per column holding every rank's rows rank after rank, ``rank`` and ``rows``
#: (:data:`RANK_INDEX_INFO`) saying whose rows they are, and one per-rank dataset per
#: rank attribute (:data:`RANK_ATTR_DTYPES`); the events the same way in
#: ``/ranks/events``. Absent (every file written before it): ``"groups"``, one
#: ``/ranks/<rank:05d>/`` group per rank with 1-D datasets and attributes. A file of
#: 16,384 ranks holds ~40 HDF5 objects instead of ~300,000; ``read_run`` reads both
#: into the same ``Run``.
RANK_LAYOUT_ATTR = "rank_layout"
RANK_LAYOUT_PACKED = "packed"
RANK_LAYOUT_GROUPS = "groups"
RANK_LAYOUTS: tuple[str, ...] = (RANK_LAYOUT_PACKED, RANK_LAYOUT_GROUPS)

#: Per-step timing phases (the column order of the run file), the step orders and
#: :class:`StrategyTraits`: declared once, in ``syncbench.algorithms.traits`` (no MPI).

#: Root attribute: JSON of what the run's strategy says about itself
#: (``Strategy.traits``: :class:`StrategyTraits`' file fields), written by the driver
#: and the simulator, so that analysis reads a strategy's behaviour from the file
#: and never keys a table by a strategy's name.
TRAITS_ATTR = "strategy_traits"

#: ASGD's report (JSON), the figures of its ``asgd:`` line: ``pushes``; ``pull_p50_ms``,
#: ``pull_p90_ms``, ``pull_max_ms`` and the same of ``push``; ``staleness_mean``,
#: ``staleness_max``, ``staleness_min_mean``, ``staleness_min_max``. Absent from other
#: strategies' files and from ASGD files written before it.
ASGD_REPORT_ATTR = "asgd_report"

#: The shipped strategies' traits as files written before :data:`TRAITS_ATTR` existed
#: imply them (read only for such files; new files carry their own).
LEGACY_TRAITS: dict[str, StrategyTraits] = {
    "ssgd": StrategyTraits(hides_comm=True, simulation="ssgd"),
    "odsgd": StrategyTraits(hides_comm=True, label_variants=(("local_lookahead", "on", "+la"),),
                            simulation="odsgd"),
    "localsgd": StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="localsgd"),
    "oscars": StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="oscars"),
    "asgd": StrategyTraits(step_order=("data", "comm", "wait", "compute", "delay", "update"),
                           split_phases={"comm": 0.5}, snapshot_evaluations=True,
                           simulation="asgd"),
}


@functools.lru_cache(maxsize=256)
def _traits_of(text: str | bytes) -> StrategyTraits:
    """The parsed attribute, once per distinct text: traces, fairness and the tables ask
    for a run's traits once per rank and per row."""
    return StrategyTraits.from_json(text)


def strategy_traits(attrs: Mapping[str, Any]) -> StrategyTraits:
    """A run's :class:`StrategyTraits` from its root attributes.

    :data:`TRAITS_ATTR` when the file has it; otherwise (files written before it)
    :data:`LEGACY_TRAITS` of its ``algorithm``; otherwise a lock-step strategy's.
    """
    text = attrs.get(TRAITS_ATTR)
    if text:
        try:
            return _traits_of(text)
        except (ValueError, TypeError):
            pass
    return LEGACY_TRAITS.get(str(attrs.get("algorithm") or ""), StrategyTraits())


#: 1-D datasets of every rank group, one row per step of that rank, with dtype.
RANK_COLUMNS: dict[str, str] = {
    "step": "i8",
    "t_start": "f8",
    **{f"t_{p}": "f8" for p in PHASES},
    "loss": "f8",
    "samples": "i8",
    "staleness": "i8",
    "staleness_min": "i8",
    "local_steps": "i8",
    "round": "i8",
    "speed": "f8",
    "cpu_compute": "f8",
    "cpu_sync": "f8",
    "cpu_step": "f8",
}

#: Rank columns that files written before they existed lack, with the value readers
#: fill in. ``staleness`` is ASGD's upper bound of a push's staleness (version at
#: the push minus the version read before the pull), ``staleness_min`` its lower
#: bound (the version at the push minus the count of pushes STARTED, read after the
#: pull; clipped at 0); ``speed`` is Oscars' c_k, the
#: seconds per local step that the step's round schedule was computed from;
#: ``t_codec`` is the codec's own phase (older files charged it to ``t_update``, so
#: theirs reads as zeros and their update holds it); ``cpu_compute``, ``cpu_sync`` and
#: ``cpu_step`` are CPU times (NaN: not measured, in older files and simulated runs).
RANK_COLUMN_DEFAULTS: dict[str, float] = {"staleness_min": 0, "speed": 0.0, "t_codec": 0.0,
                                          "cpu_compute": math.nan, "cpu_sync": math.nan,
                                          "cpu_step": math.nan}

#: Attributes of every dataset: its unit and a one-line description (from the
#: ``*_COLUMN_INFO`` tables below). Units are UDUNITS-2 strings as the CF conventions
#: use them (``s``; ``1`` for a count or another dimensionless number, the
#: description says of what). Absent from older files (every time is in seconds).
UNITS_ATTR = "units"
DESCRIPTION_ATTR = "description"

#: (units, description) of every dataset of a rank group, the keys of RANK_COLUMNS.
RANK_COLUMN_INFO: dict[str, tuple[str, str]] = {
    "step": ("1", "index of the rank's step, from 0 (a resumed run continues it)"),
    "t_start": ("s", "start of the step, since rank 0 left the start barrier, on rank 0's "
                "clock (rank attributes clock_offset_s, clock_offset_end_s)"),
    "t_data": ("s", "time the step spent taking its batch from the data stream"),
    "t_compute": ("s", "time of the step's forward and backward pass"),
    "t_comm": ("s", "time in the step's communication calls (a blocking reduction, the "
               "posting of a non-blocking one, RMA pushes and pulls)"),
    "t_wait": ("s", "time the step waited for communication posted earlier to complete"),
    "t_update": ("s", "time of the step's parameter update"),
    "t_delay": ("s", "emulated slowdown added after compute (0 on a rank not slowed)"),
    "t_codec": ("s", "time encoding, decoding and summing compressed codes (--compress, "
                "--quantize, low-precision gossip; 0 without a codec)"),
    "loss": ("1", "training loss of the step's batch (mean cross-entropy, nats)"),
    "samples": ("1", "training samples in the step's batch on this rank"),
    "staleness": ("1", "ASGD: upper bound of the push's staleness in model versions "
                  "(0 for the other strategies)"),
    "staleness_min": ("1", "ASGD: lower bound of the push's staleness in model versions "
                      "(0 for the other strategies)"),
    "local_steps": ("1", "Oscars and Local SGD: local steps of the step's round "
                    "(0 for the other strategies)"),
    "round": ("1", "Oscars and Local SGD: index of the step's synchronisation round "
              "(0 for the other strategies)"),
    "speed": ("s", "Oscars: the speed estimate c_k, seconds per local step, the round's "
              "schedule was computed from (0 for the other strategies)"),
    "cpu_compute": ("s", "CPU time of the training thread in the step's compute phase "
                    "(t_compute less what the scheduler or a CPU quota took from it; on a "
                    "GPU the host's share only; NaN where not measured: simulated runs, "
                    "older files)"),
    "cpu_sync": ("s", "CPU time of the training thread in the step's comm and wait phases "
                 "(a wait in MPI polls on the CPU; NaN where not measured)"),
    "cpu_step": ("s", "CPU time of the training thread in all of the step's phases "
                 "(NaN where not measured)"),
}

#: Attributes of every rank group.
RANK_ATTRS: tuple[str, ...] = (
    "hostname",
    # index of the rank's node in the root attribute hostnames (see NODE_ATTRS)
    "node",
    "device",
    "slowdown",
    # how the slowdown was emulated: "none" (not slowed), "work", "spin" or "sleep"
    "slowdown_mode",
    # mean reference compute seconds the delays were scaled from (NaN if not slowed)
    "slowdown_reference_s",
    # realised slowdown factor of a slowed rank (1.0 if not slowed): median per-step
    # (compute + delay) over the median of the unslowed ranks' per-step compute,
    # computed by syncbench.analysis.fairness.realised_factors(run, "median") when the
    # run file is written (older files: own mean (compute + delay) / own mean compute)
    "slowdown_realised",
    # CPU share of the rank's node as its launcher set it by the kernel (the emulated
    # cluster's --node-speed, from $SYNCBENCH_NODE_SPEED; 1.0 elsewhere): part of the
    # nominal factor, 1 / node_speed (syncbench.analysis.fairness.nominal_factors)
    "node_speed",
    # how the kernel realised that share for a process that never idles, as the cluster
    # measured it on the node: seconds running, then seconds frozen (CFS charges a quota
    # at the scheduler tick; from $SYNCBENCH_NODE_THROTTLE; NaN where there is no quota)
    "node_throttle_on_s",
    "node_throttle_off_s",
    # and the 10th and 90th percentiles of how long a process runs after an idle spell
    # before its first freeze (NaN where not measured)
    "node_throttle_first_lo_s",
    "node_throttle_first_hi_s",
    # bytes of the token bucket that shapes the rank's node's link (the emulated
    # cluster's tc tbf burst, from $SYNCBENCH_LINK_BURST): what a message after an idle
    # spell sends at once; NaN where the link is not shaped
    "link_burst_bytes",
    # this rank's clock offset to rank 0 and its uncertainty, at the start and at the
    # end of training (see CLOCK_ATTRS)
    "clock_offset_s",
    "clock_uncertainty_s",
    "clock_offset_end_s",
    "clock_uncertainty_end_s",
)

#: Rank attributes of the clock alignment (``syncbench.bench.mpi.clocks``), in seconds:
#: the rank's ``CLOCK_MONOTONIC`` minus rank 0's, measured by a minimum-round-trip
#: ping-pong with rank 0 right after the start barrier (``clock_offset_s``; time 0 of
#: the rank is rank 0's exit from that barrier mapped through it) and after training
#: (``clock_offset_end_s``; ``t_start`` is corrected for the linear drift between
#: the two), each with its uncertainty (half the minimum round trip; rank 0: 0). NaN
#: for the end in a file rebuilt by ``syncbench recover``. Absent from older files
#: (``MPI.Wtime`` rows: one node shared rank 0's barrier exit, nodes did not).
CLOCK_ATTRS: tuple[str, ...] = (
    "clock_offset_s", "clock_uncertainty_s", "clock_offset_end_s", "clock_uncertainty_end_s",
)

#: Packed layout: per-rank datasets of ``/ranks``, one per rank attribute
#: (``RANK_ATTRS``), with dtype: ``"str"`` (UTF-8, variable length), ``"i8"`` or
#: ``"f8"``. An unknown value is ``""``, -1 (:data:`RANK_ATTR_UNKNOWN`) or NaN, read as
#: the groups layout reads it (absent, absent, NaN); a string or integer attribute no
#: rank knows is left out.
RANK_ATTR_DTYPES: dict[str, str] = {
    "hostname": "str", "node": "i8", "device": "str", "slowdown": "f8",
    "slowdown_mode": "str", "slowdown_reference_s": "f8", "slowdown_realised": "f8",
    "node_speed": "f8", "node_throttle_on_s": "f8", "node_throttle_off_s": "f8",
    "node_throttle_first_lo_s": "f8", "node_throttle_first_hi_s": "f8",
    "link_burst_bytes": "f8",
    **{name: "f8" for name in CLOCK_ATTRS},
}
#: The packed layout's unknown value of a per-rank dataset, by dtype (floats: NaN).
RANK_ATTR_UNKNOWN: dict[str, Any] = {"str": "", "i8": -1}

#: (units, description) of the packed layout's per-rank attribute datasets.
RANK_ATTR_INFO: dict[str, tuple[str, str]] = {
    "hostname": ("1", "text: host name of the rank's node (\"\": unknown)"),
    "node": ("1", "index of the rank's node in the sorted host names (-1: unknown)"),
    "device": ("1", "text: the device the rank computed on (\"\": unknown)"),
    "slowdown": ("1", "nominal slowdown factor of the rank (--slowdown; 1: not slowed)"),
    "slowdown_mode": ("1", "text: how the slowdown was emulated: none, work, spin or sleep"),
    "slowdown_reference_s": ("s", "mean reference compute seconds the delays were scaled "
                             "from (NaN if not slowed)"),
    "slowdown_realised": ("1", "realised slowdown factor of a slowed rank (1 if not slowed)"),
    "node_speed": ("1", "CPU share of the rank's node as its launcher set it (1 elsewhere)"),
    "node_throttle_on_s": ("s", "the node's quota, as the kernel realised it: seconds a "
                           "never-idle process runs before it is frozen (NaN: no quota)"),
    "node_throttle_off_s": ("s", "the node's quota, as the kernel realised it: seconds it is "
                            "then frozen (NaN: no quota)"),
    "node_throttle_first_lo_s": ("s", "the node's quota: 10th percentile of the seconds a "
                                 "process runs after an idle spell before its first freeze "
                                 "(NaN: no quota, or not measured)"),
    "node_throttle_first_hi_s": ("s", "the node's quota: 90th percentile of the seconds a "
                                 "process runs after an idle spell before its first freeze "
                                 "(NaN: no quota, or not measured)"),
    "link_burst_bytes": ("B", "the token bucket of the node's shaped link: bytes a message "
                         "after an idle spell sends at once (NaN: not shaped)"),
    "clock_offset_s": ("s", "the rank's clock minus rank 0's, after the start barrier"),
    "clock_uncertainty_s": ("s", "uncertainty of clock_offset_s (half the minimum round trip)"),
    "clock_offset_end_s": ("s", "the rank's clock minus rank 0's, after training (NaN: not "
                           "measured)"),
    "clock_uncertainty_end_s": ("s", "uncertainty of clock_offset_end_s"),
}

#: (units, description) of the packed layout's index datasets of ``/ranks``.
RANK_INDEX_INFO: dict[str, tuple[str, str]] = {
    "rank": ("1", "the rank of each entry of the per-rank datasets, ascending"),
    "rows": ("1", "step rows of each rank in the row datasets, which hold the ranks' rows "
             "one rank after the other, in the order of rank"),
}

#: ``--events on``: a subgroup of every rank group (``/ranks/<r>/events``; packed layout:
#: one ``/ranks/events`` for all ranks, as ``/ranks`` itself) with one row per collective
#: call the rank made (``syncbench.algorithms.events``); absent otherwise.
EVENTS_GROUP = "events"
#: The calls an event records; the ``kind`` column is the position here, and the group's
#: ``names`` attribute lists these names. ``rma_pull`` / ``rma_push``: one
#: passive-target epoch of ASGD's parameter window (Get_accumulate / Accumulate).
#: ``ineighbor_allgather``: D-PSGD's exchange with its graph neighbours (bytes: sent).
#: ``ialltoallv`` / ``iallgather``: halves of a compressed reduction (``--compress``).
#: ``rma_counter``: one epoch on ASGD's counters, which rank 0 hosts (a read, the push's
#: start, or its count and next ticket; bytes: 8 per counter).
EVENT_KINDS: tuple[str, ...] = ("allreduce", "iallreduce", "bcast", "barrier",
                                "rma_pull", "rma_push", "ineighbor_allgather", "ialltoallv",
                                "iallgather", "rma_counter")
EVENT_COLUMNS: dict[str, str] = {
    "step": "i8",
    "kind": "i1",
    "index": "i4",
    "t_post": "f8",
    "t_done": "f8",
    "bytes": "i8",
    "wait_s": "f8",
}
#: (units, description) of every dataset of an events group (EVENT_COLUMNS' keys).
EVENT_COLUMN_INFO: dict[str, tuple[str, str]] = {
    "step": ("1", "the rank's step during which the call was posted"),
    "kind": ("1", "the call: a position in the group's names attribute"),
    "index": ("1", "the call's place among its step's calls of that kind, from 0 "
              "(SSGD overlap: the bucket)"),
    "t_post": ("s", "when the call was posted, on the clock of t_start"),
    "t_done": ("s", "when the rank saw the call complete (a blocking call's return), on the "
               "clock of t_start; NaN if it never did"),
    "bytes": ("By", "bytes of the buffer the call reduced, sent or read"),
    "wait_s": ("s", "time the rank blocked in Wait/Waitall/Barrier for it (0: blocking "
               "calls, and requests a test found complete)"),
}
#: Attributes of an events group: the kind names, the buffer's size in events, the step
#: stride of the sample it kept (1: every step; a full buffer doubles it and keeps the
#: steps that are multiples), events posted while recording, and those not kept.
EVENT_COUNT_ATTRS: tuple[str, ...] = ("capacity", "stride", "recorded", "dropped")
EVENT_ATTRS: tuple[str, ...] = ("names", *EVENT_COUNT_ATTRS)
#: (units, description) of the packed layout's datasets of ``/ranks/events`` beyond the
#: columns: whose events the rows are, and each rank's counters (``EVENT_COUNT_ATTRS``,
#: per-rank datasets there; ``names`` stays an attribute of the group).
EVENT_PACKED_INFO: dict[str, tuple[str, str]] = {
    "rank": ("1", "the rank of each entry of the per-rank datasets, ascending"),
    "rows": ("1", "events of each rank in the event columns, which hold the ranks' events "
             "one rank after the other, in the order of rank"),
    "capacity": ("1", "size of the rank's event buffer, in events"),
    "stride": ("1", "step stride of the sample the rank kept (1: every step)"),
    "recorded": ("1", "events the rank posted while recording"),
    "dropped": ("1", "events the rank did not keep (its buffer was full)"),
}

#: Group of evaluation rows (of the consensus model on the held-out split).
EVAL_GROUP = "eval"
EVAL_COLUMNS: dict[str, str] = {
    "t": "f8",
    "step": "i8",
    "samples_seen": "i8",
    "loss": "f8",
    "accuracy": "f8",
}

#: (units, description) of every dataset of /eval and /eval_local (EVAL_COLUMNS' keys).
EVAL_COLUMN_INFO: dict[str, tuple[str, str]] = {
    "t": ("s", "time of the evaluation, since rank 0 left the start barrier"),
    "step": ("1", "rank 0's step count at the evaluation"),
    "samples_seen": ("1", "training samples all ranks had consumed before the evaluation"),
    "loss": ("1", "mean cross-entropy (nats) on the held-out split"),
    "accuracy": ("1", "fraction of the held-out split classified correctly"),
}

#: ``--eval-model both``: every rank's own model on its shard of the test split
#: (the same columns; absent otherwise). ``/summary`` then has
#: ``final_local_accuracy``, its last accuracy.
EVAL_LOCAL_GROUP = "eval_local"
FINAL_LOCAL_ACCURACY = "final_local_accuracy"

#: (units, description) of every dataset, by the group that holds it: a rank group
#: (``RANKS_GROUP``, for every ``/ranks/<r>/``, and the packed ``/ranks`` with its
#: index and attribute datasets), ``/eval``, ``/eval_local``, an events group. A writer
#: gives each dataset these as its ``units`` and ``description`` attributes; a new
#: dataset or group gets its entry here.
DATASET_INFO: dict[str, dict[str, tuple[str, str]]] = {
    RANKS_GROUP: {**RANK_COLUMN_INFO, **RANK_INDEX_INFO, **RANK_ATTR_INFO},
    EVAL_GROUP: EVAL_COLUMN_INFO,
    EVAL_LOCAL_GROUP: {
        **EVAL_COLUMN_INFO,
        "loss": ("1", "mean cross-entropy (nats) of every rank's own model on its shard of "
                 "the held-out split, pooled over the shards"),
        "accuracy": ("1", "fraction of the held-out split that every rank's own model "
                     "classified correctly on its shard, pooled over the shards"),
    },
    EVENTS_GROUP: {**EVENT_COLUMN_INFO, **EVENT_PACKED_INFO},
}

#: Root and rank attributes that are floats: an unknown value is NaN. Any other
#: attribute whose value is unknown or empty (``cupy_version`` without CuPy,
#: ``slurm_job_id`` outside Slurm, ``git_sha`` outside a checkout, ``scaling_mode``
#: outside a scaling study, ``/summary``'s ``stopped_by`` of a run that ended by
#: itself) is absent, never ``""``; ``read_run`` reads an ``""`` of an older file as
#: absent too.
FLOAT_ATTRS: frozenset[str] = frozenset({
    "t_begin_unix", "t_end_unix", "load_begin", "load_end", "foreign_cpu_s",
    "foreign_cpu_share", "slowdown", "slowdown_reference_s", "slowdown_realised",
    "node_speed", "node_throttle_on_s", "node_throttle_off_s", "node_throttle_first_lo_s",
    "node_throttle_first_hi_s", "link_burst_bytes", "clock_offset_s",
    "clock_uncertainty_s", "clock_offset_end_s",
    "clock_uncertainty_end_s",
})

#: Root attributes of a decentralized strategy's run only (D-PSGD's, AD-PSGD's).
DECENTRALIZED_ATTRS: tuple[str, ...] = ("spectral_gap", "consensus_samples",
                                        "consensus_distance", "replica_accuracy_mean",
                                        "replica_accuracy_worst")

#: Root attributes of a DiLoCo run only (files written before them lack them too).
DILOCO_ATTRS: tuple[str, ...] = ("wire_bytes_per_fragment",)

#: Root attributes of a strategy of rounds (Local SGD, SlowMo, DiLoCo, hierarchical,
#: Oscars): one round's bytes and its local steps (files written before them, and other
#: strategies', lack them).
ROUND_ATTRS: tuple[str, ...] = ("wire_bytes_per_outer_step", "outer_period_steps")

#: Root attributes that a measured run lacks where their value is unknown (no git
#: checkout, no CuPy, not a Slurm job, not a scaling study), and the GPU_ATTRS and
#: DATA_ATTRS, which files written before them and simulations lack (a run writes
#: ``data_files`` or ``data_generator``, not both); every other name of ROOT_ATTRS is
#: always written.
OPTIONAL_ROOT_ATTRS: tuple[str, ...] = ("git_sha", "cupy_version", "cupy_package",
                                        "slurm_job_id", "scaling_mode", *GPU_ATTRS,
                                        *DATA_ATTRS, *DECENTRALIZED_ATTRS, *DILOCO_ATTRS,
                                        *ROUND_ATTRS, ASGD_REPORT_ATTR)

#: Group whose attributes summarise the run.
SUMMARY_GROUP = "summary"
SUMMARY_ATTRS: tuple[str, ...] = (
    "wall_s",
    "samples_per_s",
    "final_accuracy",
    "final_loss",
    "time_to_target_s",
    "comm_fraction",
    "wait_fraction",
)

#: ``/summary`` attributes beyond ``SUMMARY_ATTRS`` (bool; absent from older files:
#: readers find them in ``Run.summary_extra`` and default them). ``diverged``:
#: non-finite training loss on some rank, or final accuracy <= 1.5 / classes.
SUMMARY_FLAGS: tuple[str, ...] = ("diverged",)

#: False on a run that did not consume its whole sample budget: rebuilt from the
#: parts of a job that died (``syncbench recover``), or stopped by a signal. Written
#: both as a root attribute (older readers) and as a ``/summary`` attribute.
COMPLETE_ATTR = "complete"

#: ``/summary`` attribute (str): the signal's name (``SIGTERM``, ``SIGINT``,
#: ``SIGUSR1``) that stopped the run at a step boundary; absent from a run that ended
#: by itself or was rebuilt by ``recover`` (older files: "" or absent; read as "").
STOPPED_BY_ATTR = "stopped_by"

#: Root attribute (int): how many times the run was continued with ``--resume``
#: (0 for a run that never was; absent from older files).
RESUMES_ATTR = "resumes"

#: Root attributes of a run written by ``syncbench simulate`` (absent from measured
#: runs: readers default ``simulated`` to False). ``simulated`` (bool); the others
#: are JSON: the simulated platform (kind, link bandwidth B/s and latency s, hosts,
#: GPUs per node, calibration file), the workload (model, parameters, batch, where its
#: step times came from) and the simulation itself (SimGrid version, wall seconds,
#: flows simulated, flows per second, the allreduce algorithm, the stragglers).
SIMULATED_ATTR = "simulated"
SIM_PLATFORM_ATTR = "platform"
SIM_WORKLOAD_ATTR = "workload"
SIM_RUN_ATTR = "simulation"
SIMULATION_ATTRS: tuple[str, ...] = (
    SIMULATED_ATTR, SIM_PLATFORM_ATTR, SIM_WORKLOAD_ATTR, SIM_RUN_ATTR,
)

#: Keys of one ``syncbench report`` row, in column order (JSON adds ``path``).
#: ``stopped_by`` and ``resumes`` are ``Run.stopped_by`` and ``Run.resumes`` (see
#: STOPPED_BY_ATTR, RESUMES_ATTR; added after the older keys).
REPORT_KEYS: tuple[str, ...] = (
    "algorithm",
    "world_size",
    "samples_per_s",
    "wall_s",
    "final_accuracy",
    "time_to_target_s",
    "comm_fraction",
    "wait_fraction",
    "stopped_by",
    "resumes",
)


def rank_group(rank: int) -> str:
    """Path of one rank's group, e.g. ``ranks/00003``."""
    return f"{RANKS_GROUP}/{rank:05d}"
