"""``syncbench simulate --validate RUN.h5 ...``: measured vs predicted, per run.

Each measured run's configuration (algorithm and its flags, ranks,
``--slowdown``, the global budget of local steps) is simulated with the
workload of ``--workload`` (a DIFFERENT run, e.g. a 1-rank run of the same
model: replaying a run's own step times would prove little) on the platform
of ``--calibrate`` (this machine, fitted to ``syncbench comm``). Measured
and predicted phase figures are computed from the rows by the same
function (:func:`row_figures`): the mean seconds per step of ``compute``
(compute + delay), ``sync`` (comm + wait) and ``other`` (data + update + codec).
Measured samples/s is the run's own, on the clock of ``wall_s``
(:func:`measured_samples_per_s`): the span of a measured run's rows also
holds its evaluation pauses, which ``wall_s`` leaves out and a simulated
run does not have (lenet, 2 ranks, 0.5 epoch: 18,627 samples/s by
``wall_s``, 9,636 by the rows' span). A rank's slowdown is its ``--slowdown`` factor
and its node's speed (the emulated cluster's CPU quota) is ``--node-speed``
(:func:`rank_factors`); ``--validate-realised`` simulates the factors each rank
realised instead (:func:`realised_factors`). A compressed run's codec is timed here
(``--codec-seconds auto``) unless the flag is given. The table ends with the error
per label and configuration, each repeat's (:func:`error_table`) and the configuration's,
the geometric mean of its repeats' (:func:`config_table`); ``--validate-out`` keeps the
predictions as run files, ``--validate-csv`` each run's row (which ``--validate-pool``
pools over validation sets, :mod:`.validate_pool`). The ``load`` column is the measured run's
highest recorded load average (others' processes on the host).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from syncbench.analysis.context import LOADED_SHARE, foreign_share
from syncbench.analysis.output_paths import check_new_file, check_output_dir
from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.analysis.schema import LOAD_ATTRS
from syncbench.bench.experiment.results_paths import read_results
from syncbench.bench.files import WriteError
from syncbench.bench.simulate.inputs import build_platform, build_workload
from syncbench.bench.simulate.quota import (
    Throttle,
    parse_node_throttles,
    parse_wait_cpu,
    throttle_spec,
)
from syncbench.bench.simulate.run import simulate
from syncbench.bench.simulate.validate_pool import ValidationRow, write_table
from syncbench.bench.simulate.workload import (
    between_phases,
    node_speed_of,
    parse_stragglers,
    rank_factor,
)

FIGURES = ("samples_per_s", "compute_ms", "sync_ms", "other_ms")


def row_figures(ranks: dict[int, dict[str, np.ndarray]]) -> dict[str, float]:
    """Throughput and mean phase times (ms per step) of per-rank rows; ``other_ms`` holds
    the time between a step's phases (:func:`~.workload.between_phases`), which a
    simulated rank replays with its data."""
    begin, end, samples, rows = math.inf, 0.0, 0.0, 0
    sums = {"compute_ms": 0.0, "sync_ms": 0.0, "other_ms": 0.0}
    for cols in ranks.values():
        if len(cols["step"]) == 0:
            continue
        zeros = np.zeros(len(cols["step"]))  # rows without t_codec (older files): none
        phases = {p: np.asarray(cols.get(f"t_{p}", zeros), dtype=float)
                  for p in ("data", "compute", "comm", "wait", "update", "delay", "codec")}
        total = sum(phases.values())
        begin = min(begin, float(cols["t_start"][0]))
        end = max(end, float(np.max(np.asarray(cols["t_start"]) + total)))
        samples += float(np.sum(cols["samples"]))
        rows += len(cols["step"])
        sums["compute_ms"] += float(np.sum(phases["compute"] + phases["delay"]))
        sums["sync_ms"] += float(np.sum(phases["comm"] + phases["wait"]))
        sums["other_ms"] += float(np.sum(phases["data"] + phases["update"] + phases["codec"]
                                         + between_phases(cols)))
    span = end - begin if rows else math.nan
    out = {"samples_per_s": samples / span if span and span > 0 else math.nan}
    out.update({k: 1e3 * v / rows if rows else math.nan for k, v in sums.items()})
    return out


def measured_samples_per_s(run: Any) -> float:
    """A measured run's samples/s on the training clock: its summary's ``samples_per_s``
    (samples over ``wall_s``, evaluation pauses left out); the rows' span where absent."""
    value = run.summary.get("samples_per_s", math.nan) if run.summary else math.nan
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = math.nan
    return value if math.isfinite(value) and value > 0 else \
        row_figures(run.ranks)["samples_per_s"]


def _job(args: argparse.Namespace, run: Any,
         workload_speed: float = 1.0) -> tuple[argparse.Namespace, int, int]:
    """The simulate configuration of a measured run; its ranks' node speeds are taken
    relative to ``workload_speed``, the speed of the node the workload was measured on."""
    cfg = argparse.Namespace(**vars(args))
    for key, value in run.config.items():
        if hasattr(cfg, key) and key not in ("out", "seed", "validate", "batch_size"):
            setattr(cfg, key, value)
    cfg.algorithm, cfg.out = run.algorithm, None
    if str(getattr(args, "codec_seconds", "0")) in ("0", "0.0"):  # not given: time it here
        cfg.codec_seconds = "auto"
    factors, speeds = rank_factors(run)
    speeds = relative_speeds(run, speeds, workload_speed)
    if getattr(args, "validate_realised", False) and (any(f != 1.0 for f in factors)
                                                      or any(s < 1.0 for s in speeds)):
        # the factors the run realised (its own compute), not the nominal ones
        factors, speeds = realised_factors(run), [1.0] * len(speeds)
    if any(f != 1.0 for f in factors):
        cfg.slowdown = ",".join(f"{f:g}" for f in factors)
    cfg.node_speed = ",".join(f"{s:g}" for s in speeds) if any(s < 1.0 for s in speeds) \
        else None
    # the quota's bursts and the links' bucket: the flag where given, else the run's
    # record; a recorded pattern is absolute, so not against a workload that ran at a quota
    throttles = [throttle_of(run.rank_attrs.get(rank, {})) if speed < 1.0 else None
                 for rank, speed in zip(sorted(run.ranks), speeds)]
    efficiency = getattr(args, "quota_efficiency", None)
    given = getattr(args, "node_throttle", None)
    if given and efficiency is not None:
        # --node-throttle's pattern, where given, is set to --quota-workload's share as a
        # recorded one is (the flag replaces the record, not the efficiency)
        throttles = parse_node_throttles(given, speeds, len(speeds)) or []
    if efficiency is not None:  # each throttled rank at its speed's realised share
        throttles = [None if t is None else with_share(t, efficiency * s)
                     for t, s in zip(throttles, speeds)]
    if ((not given or efficiency is not None) and workload_speed >= 1.0
            and any(t is not None for t in throttles)):
        cfg.node_throttle = throttle_spec(throttles)
    if (getattr(cfg, "node_throttle", None)  # only a throttled rank's quota charges waits
            and getattr(args, "node_wait_cpu", None) in (None, "")):  # the flag wins
        cfg.node_wait_cpu = wait_cpu_share(run)
    bursts = [float(run.rank_attrs.get(rank, {}).get("link_burst_bytes", math.nan))
              for rank in sorted(run.ranks)]
    bursts = [b for b in bursts if math.isfinite(b) and b > 0]
    if bursts and getattr(args, "link_burst", None) in (None, ""):
        cfg.link_burst = min(bursts)
    n = run.world_size
    total = sum(len(cols["step"]) for cols in run.ranks.values())
    return cfg, n, max(1, round(total / n))


def _efficiency(path: str, model: str) -> float:
    """One ``--quota-workload`` run's efficiency: in a run where no rank communicated, the
    share of the CPU a throttled rank realised over its step (:func:`measured_share`),
    over its node's speed (the quota it was given: ``--node-speed``); the mean over its
    throttled ranks. Against the speed, not the pattern the node's probe recorded: that
    pattern's never-idle share moved from one setting of the quota to the next (0.37-0.49
    at speed 0.5 on a KVM guest on an Intel Xeon) while what a training rank realised
    stayed at 0.43-0.48; taken against the pattern, lenet's quota column at 200 Mbit/s had
    5 configurations off where against the speed it had 3 (docs/RESULTS.md, "A throttled
    rank's own CPU time")."""
    try:
        run = read_run(path)
    except RunFileError as exc:
        raise ValueError(f"--quota-workload {exc}") from None
    if run.model != model:
        raise ValueError(f"--quota-workload {path}: model {run.model}, but --workload "
                         f"ran {model}")
    factors, speeds = rank_factors(run)
    ranks = sorted(run.ranks)
    free = [r for r, f, s in zip(ranks, factors, speeds) if f == 1.0 and s >= 1.0]
    slow = [(r, s) for r, s in zip(ranks, speeds) if s < 1.0]
    # the throttled ranks hardly wait in MPI (the free ones wait for them at the stop
    # votes; a throttled rank's share of the votes: 5% of mlp's compute at speed 0.5)
    talked = any(float(np.sum(run.ranks[r]["t_comm"][2:])) > 0.25 *
                 float(np.sum(run.ranks[r]["t_compute"][2:])) for r, _ in slow)
    if not free or not slow or talked:
        raise ValueError(f"--quota-workload {path}: give a run with a rank at a quota, a "
                         "rank at full speed, and no communication (syncbench train "
                         "--algorithm localsgd --period 1000000000 on a cluster with "
                         "--node-speed)")
    return float(np.mean([measured_share(run, r) / s for r, s in slow]))


def measured_share(run: Any, rank: int) -> float:
    """The share of the CPU throttled ``rank`` realised in a run of no communication: its
    CPU work per step over its step's wall time (the mean gap between its steps' starts,
    its first two steps left out). Its work is its compute's CPU time (:func:`cpu_per_step`)
    plus the mean data, update and codec seconds of the free ranks and their time between
    phases (:func:`free_rank_steps`, :func:`~.workload.between_phases`: at full speed, the
    same work; the simulation replays the latter with the data). In a file without the CPU
    time: the free ranks' mean compute over the rank's (its compute phase alone, as
    before the column).

    Why the whole step and the rank's own CPU time: on a KVM guest on an Intel Xeon (lenet,
    speed 0.5) the throttled rank's compute ran 0.53 of its wall on the CPU, but 9-17% of
    its step passed outside its phases, against 2% at full speed (the phase timer's read of
    the CPU clock on leaving compute, a point where the kernel checks the quota, came
    after the wall clock's, so the freezes it brought on fell between phases; the timer
    reads it first since, docs/RESULTS.md, "The CPU clock's reads and the quota"); and its
    CPU did a step's compute in 4.5-4.9 ms where the free rank's took 3.6-4.9. With its own
    CPU time but the compute phase alone, lenet's quota column at 1 Gbit/s
    (`--validate-host-speed rank`) was predicted 15-29% fast; from the whole step, 1-13%
    (docs/RESULTS.md, "A throttled rank's own CPU time")."""
    cpu = cpu_per_step(run, rank)
    starts = np.asarray(run.ranks[rank]["t_start"], dtype=float)
    if cpu is None or len(starts) < 4:
        return (float(np.mean(free_rank_steps(run, "t_compute")))
                / float(np.mean(run.ranks[rank]["t_compute"][2:])))
    other = sum(float(np.mean(free_rank_steps(run, column)))
                for column in ("t_data", "t_update", "t_codec"))
    between = [between_phases(run.ranks[r])[2:] for r in free_ranks(run)]
    other += float(np.mean(np.concatenate(between))) if between else 0.0
    return (cpu + other) / float(np.mean(np.diff(starts)[2:]))


def cpu_per_step(run: Any, rank: int) -> float | None:
    """``rank``'s mean CPU time per step in its compute phase (the ``cpu_compute`` column),
    its first two steps left out as the replay does; None where the run did not measure
    it (a file written before the column, a simulated run) or it is not positive."""
    column = run.ranks[rank].get("cpu_compute")
    steps = np.asarray(column[2:] if column is not None else [], dtype=float)
    if not len(steps) or not np.all(np.isfinite(steps)):
        return None
    mean = float(np.mean(steps))
    return mean if mean > 0 else None


def quota_efficiency(paths: list[str], model: str) -> float:
    """The mean efficiency (:func:`_efficiency`) of the ``--quota-workload`` runs. Where the
    tick falls against the quota's period is drawn anew each time the quota is set, and
    with it what a rank realises of it; ``jobs/validate_simulator.sh`` sets the quota
    three times."""
    return float(np.mean([_efficiency(path, model) for path in paths]))


def _print_quota_efficiency(paths: list[str], model: str) -> float:
    """:func:`quota_efficiency` of ``--quota-workload``'s runs, printed."""
    efficiency = quota_efficiency(paths, model)
    print(f"--quota-workload ({len(paths)} run(s)): a throttled rank realised {efficiency:.3f} "
          "of its node's speed over its step")
    return efficiency


def with_share(throttle: Throttle, share: float) -> Throttle:
    """``throttle`` at the never-idle ``share`` (at most 1): the same running span and
    first burst, a longer (or shorter) frozen span."""
    share = min(1.0, share)
    off = throttle.on_s * (1.0 / share - 1.0) if share < 1.0 else 1e-9
    return dataclasses.replace(throttle, off_s=off)


def throttle_of(attrs: dict[str, Any]) -> Throttle | None:
    """A rank's node quota pattern as its run recorded it (``node_throttle_on_s`` and
    ``node_throttle_off_s``, with ``node_throttle_first_lo_s`` and ``_hi_s`` where
    recorded), or None (no quota, or a file from before the record)."""
    def seconds(key: str) -> float | None:
        try:
            value = float(attrs.get(key))
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) and value > 0 else None

    on, off = seconds("node_throttle_on_s"), seconds("node_throttle_off_s")
    if on is None or off is None:
        return None
    low, high = seconds("node_throttle_first_lo_s"), seconds("node_throttle_first_hi_s")
    if low is None or high is None or low > high:
        return Throttle(on, off)
    return Throttle(on, off, low, high)


def predicted_path(out_dir: str, measured: str, overwrite: bool) -> str:
    """``DIR/predicted-NAME.h5`` for the measured run ``NAME.h5`` (DIR made if missing);
    an existing file is refused unless ``overwrite``; a folder that cannot be written is
    one line (``output_paths.check_output_dir``), before anything is simulated."""
    check_output_dir("--validate-out", out_dir)  # an OutputError is a ValueError
    try:  # what access() passes may still refuse a folder (/proc, a full disk)
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--validate-out {out_dir}: {exc.strerror}") from None
    path = os.path.join(out_dir, "predicted-" + os.path.basename(measured))
    check_new_file("--validate-out", path, overwrite)
    return path


def rank_factors(run: Any) -> tuple[list[float], list[float]]:
    """Per rank, in rank order: train's ``--slowdown`` factor and its node's CPU share
    (the rank attributes ``slowdown`` and ``node_speed``; 1 where absent). The share
    goes to the simulator as ``--node-speed`` (:mod:`.quota`), not folded into the
    factor: a quota slows the rank's data and update too, a ``--slowdown`` only its
    compute."""
    factors, speeds = [], []
    for rank in sorted(run.ranks):
        attrs = run.rank_attrs.get(rank, {})
        factors.append(rank_factor(attrs, "slowdown"))
        speeds.append(node_speed_of(attrs))
    return factors, speeds


def relative_speeds(run: Any, speeds: list[float], workload_speed: float) -> list[float]:
    """Each rank's node speed over the workload's: a workload measured on a node at
    speed 0.5 (a 1-rank run on one of the nodes that share a core, ``syncbench cluster
    up --nodes 4 --node-speed 0.5,0.5,0.5,0.5`` on two CPUs) already holds what that
    share does to a step, so a run on such nodes is simulated at speed 1. A rank on a
    faster node than the workload's cannot be predicted from it (a quota only slows):
    one line, naming both."""
    if workload_speed >= 1.0:
        return speeds
    fastest = max(speeds)
    if fastest > workload_speed * (1.0 + 1e-9):
        raise ValueError(f"--validate {run.path}: a rank ran on a node at speed {fastest:g}, "
                         f"faster than the --workload's node ({workload_speed:g}): measure "
                         "the workload on a node at the runs' fastest speed")
    return [min(1.0, s / workload_speed) for s in speeds]


def realised_factors(run: Any) -> list[float]:
    """Per rank, the slowdown the run realised (rank attribute ``slowdown_realised``: its
    compute and delay over the free ranks' compute, ``fairness``); 1 where absent. What
    ``--validate-realised`` simulates: it separates the simulator's error from the gap
    between a nominal slowdown and what the host made of it."""
    return [max(1.0, rank_factor(run.rank_attrs.get(rank, {}), "slowdown_realised"))
            for rank in sorted(run.ranks)]


def configuration(run: Any) -> str:
    """The run's heterogeneity in a few characters: ``hom``, ``work 2x`` (``--slowdown``
    and its mode), ``quota 0.5`` (the slowest node's share), or both."""
    factors, speeds = rank_factors(run)
    parts = []
    if any(f != 1.0 for f in factors):
        attrs = run.rank_attrs.get(sorted(run.ranks)[factors.index(max(factors))], {})
        mode = str(attrs.get("slowdown_mode", "") or run.config.get("slowdown_mode", ""))
        parts.append(f"{mode} {max(factors):g}x" if mode and mode != "none"
                     else f"slow {max(factors):g}x")
    if any(v < 1.0 for v in speeds):
        parts.append(f"quota {min(speeds):g}")
    return " ".join(parts) or "hom"


def validate_main(args: argparse.Namespace) -> int:
    """Body of ``--validate``: one table row of measured vs predicted per run file."""
    table_path = check_table_path(args)
    parse_wait_cpu(getattr(args, "node_wait_cpu", None))
    runs = []
    for path in args.validate:
        try:
            runs.append(read_run(path))
        except RunFileError as exc:
            raise ValueError(f"--validate {exc}") from None
    workload = pooled_workload(args, build_workload(args))
    by_codec = compressed_workloads(args, workload)
    if getattr(args, "quota_workload", None):
        args.quota_efficiency = _print_quota_efficiency(args.quota_workload, workload.name)
    chosen = [workload_for(run, workload, by_codec) for run in runs]
    mode = getattr(args, "validate_host_speed", "workload")
    hosts = [host_speeds(mode, run, w) for run, w in zip(runs, chosen)]
    codecs = [codec_factor(run, w, float(np.mean(h))) if mode != "workload" else 1.0
              for run, w, h in zip(runs, chosen, hosts)]
    chosen = [scaled_for_host(w, h, c) for w, h, c in zip(chosen, hosts, codecs)]
    jobs = [_job(args, run, w.node_speed) for run, w in zip(runs, chosen)]
    _name_predictions(args, runs, jobs)
    spec, xml = build_platform(args)
    try:
        results = simulate(args, jobs, spec, xml, chosen, parse_stragglers(args.stragglers))
    except WriteError as exc:  # a --validate-out folder changed during the simulation
        raise ValueError(str(exc)) from None
    workload_speed = workload.node_speed
    _print_codec_costs(by_codec, workload)
    print(f"workload {workload.source} ({workload.name}, {workload.params} parameters"
          + (f", measured on a node at speed {workload_speed:g}: the runs' node speeds are "
             "taken relative to it" if workload_speed < 1.0 else "") + "); "
          f"platform {spec.kind}"
          + (f" calibrated from {spec.calibrated_from}: latency {2 * spec.latency * 1e6:.2f} us,"
             f" bandwidth {spec.bandwidth / 1e9:.3f} GB/s" if spec.calibrated_from else ""))
    head = (f"{'run':<34} {'alg':<8} {'N':>2} {'config':<16} {'load':>5} {'meas/s':>9} "
            f"{'pred/s':>9} {'err':>6} {'comp ms m/p':>13} {'sync ms m/p':>13} "
            f"{'other ms m/p':>13}")
    print(head)
    errors, cells, loaded_runs, table = [], [], [], []
    labels = runner_labels([run.path for run in runs])
    for run, (_cfg, n, _), result, host in zip(runs, jobs, results, hosts):
        m = {**row_figures(run.ranks), "samples_per_s": measured_samples_per_s(run)}
        p = row_figures(result.timeline.rows.arrays())
        err = p["samples_per_s"] / m["samples_per_s"] - 1.0
        errors.append(abs(err))
        name = run.path.rsplit("/", 1)[-1]
        config = configuration(run)
        cells.append((labels[run.path], config, err))
        table.append(ValidationRow(os.path.abspath(run.path),
                                   run.model or workload.name,
                                   labels[run.path], config, m["samples_per_s"],
                                   p["samples_per_s"], spec.bandwidth))
        note, share = row_note(run, workload.name, host)
        if share is not None:
            loaded_runs.append(share)
        print(f"{name[:34]:<34} {run.algorithm:<8} {n:>2} {config[:16]:<16} {run_load(run):>5} "
              f"{m['samples_per_s']:>9.0f} "
              f"{p['samples_per_s']:>9.0f} {100 * err:>+5.0f}% "
              f"{m['compute_ms']:>6.2f}/{p['compute_ms']:<6.2f} "
              f"{m['sync_ms']:>6.2f}/{p['sync_ms']:<6.2f} "
              f"{m['other_ms']:>6.2f}/{p['other_ms']:<6.2f}{note}")
    _print_totals(errors, loaded_runs, cells)
    if table_path:
        try:
            write_table(table_path, table)
        except WriteError as exc:  # the folder changed during the simulation
            raise ValueError(f"--validate-csv: {exc}") from None
        print(f"# each run's row -> {table_path} (syncbench simulate --validate-pool pools "
              "such files)")
    return 0


def check_table_path(args: argparse.Namespace) -> str | None:
    """``--validate-csv``'s path, checked before anything is read or printed: a file that
    can be written, not one that exists (but with ``--overwrite``)."""
    path = getattr(args, "validate_csv", None)
    if path:
        check_new_file("--validate-csv", path, getattr(args, "overwrite", False))
    return path


def _name_predictions(args: argparse.Namespace, runs: list[Any], jobs: list[Any]) -> None:
    """Each job's ``--validate-out`` file, before the calibration prints or anything is
    simulated."""
    out_dir = getattr(args, "validate_out", None)
    if out_dir:
        for run, (cfg, _, _) in zip(runs, jobs):
            cfg.out = predicted_path(out_dir, run.path, bool(getattr(args, "overwrite", False)))


def _print_totals(errors: list[float], loaded_runs: list[float],
                  cells: list[tuple[str, str, float]]) -> None:
    """The lines under the runs' rows: the mean error, the load, and the tables per label
    and configuration."""
    if errors:
        print(f"mean |error| {100 * float(np.mean(errors)):.1f}%, "
              f"max {100 * float(np.max(errors)):.1f}% over {len(errors)} runs")
    print("load: the host's highest 1-minute load average during the measured run; above its "
          "cores, other processes took CPU time the simulation does not know about")
    if loaded_runs:
        print(loaded_line(loaded_runs, len(errors)))
    if len({c for _, c, _ in cells}) > 1 or len(cells) > len({lbl for lbl, _, _ in cells}):
        print()
        print(error_table(cells))
        print()
        print(config_table(cells))


def _print_codec_costs(by_codec: dict[str, Any], workload: Any) -> None:
    """One line per ``--compressed-workload``: what a step of its codec pays (before each
    run's host factors, :func:`workload_for`)."""
    for codec, w in sorted(by_codec.items()):
        beyond = between_beyond(w, workload)
        plus = (f", plus {1e3 * beyond:.3f} ms of its time between phases beyond the "
                "workload's" if w.mean_codec_s > 0 else " (none: its update rows hold it)")
        print(f"--compress {codec}: the codec's cost {1e3 * w.mean_codec_s:.3f} ms a step, "
              f"the mean t_codec of {w.source}{plus}")


def compressed_workloads(args: argparse.Namespace, default: Any) -> dict[str, Any]:
    """``--compressed-workload``'s runs by codec (each a measured run of ``--workload``'s
    model with a ``--compress`` of its own; one line for anything else)."""
    found: dict[str, Any] = {}
    for path in getattr(args, "compressed_workload", None) or []:
        try:
            w = build_workload(argparse.Namespace(**{**vars(args), "workload": path}))
        except ValueError as exc:  # the reader names --workload: name the flag given
            raise ValueError(str(exc).replace("--workload", "--compressed-workload", 1)
                             ) from None
        codec = str(w.extra.get("compress", "none"))
        if w.rows is None or codec == "none":
            raise ValueError(f"--compressed-workload {path}: ran without --compress (give "
                             "a 1-rank run with the codec of the runs it stands for)")
        if w.name != default.name:
            raise ValueError(f"--compressed-workload {path}: model {w.name}, but --workload "
                             f"is {default.name}")
        if codec in found:
            raise ValueError(f"--compressed-workload: two runs of --compress {codec} "
                             f"({found[codec].source}, {path})")
        found[codec] = w
    return found


def between_beyond(measured: Any, default: Any) -> float:
    """Seconds a step of the codec run ``measured`` spent between its phases beyond the
    workload ``default``'s (never below 0): what :func:`workload_for` charges with it."""
    return max(0.0, measured.mean_between_s - default.mean_between_s)


def workload_for(run: Any, default: Any, by_codec: dict[str, Any]) -> Any:
    """The workload a measured run is predicted from: ``--workload``'s step times (the
    runs' own host conditions, e.g. two ranks computing at once) with, for a compressed
    run, the mean ``t_codec`` of its codec's ``--compressed-workload`` (one written
    before that column holds the codec in its update rows: then that run whole), and
    that run's time between phases beyond the workload's (``codec_between_s``).

    Why the time between phases: a compressed step runs the reducer's own work outside
    its codec phase (the error-feedback buffers, the reducer's calls). On mlp and lenet
    (2 emulated nodes) a compressed step spent 0.16-0.25 ms between its phases, the
    1-rank codec runs 0.11-0.23 ms, the workload run 0.05-0.09 ms; PowerSGD's and
    top-k's short steps were predicted fast in nearly every set (docs/RESULTS.md, "A
    compressed step's time between phases")."""
    codec = str(run.config.get("compress", "none") or "none")
    measured = by_codec.get(codec) if run.model == default.name else None
    if measured is None:
        return default
    if not measured.mean_codec_s > 0:  # a file before t_codec: its update rows hold it
        return measured
    return dataclasses.replace(default, mean_codec_s=measured.mean_codec_s,
                               mean_calls_s=measured.mean_calls_s,
                               codec_between_s=between_beyond(measured, default),
                               extra={**default.extra, "compress": codec,
                                      "codec_source": measured.source,
                                      "codec_world_size": measured.extra.get(
                                          "measured_world_size", 1)})


def pooled_workload(args: argparse.Namespace, workload: Any) -> Any:
    """The workload whose rows every prediction replays: with ``--validate-workload-ranks
    pooled`` (the default) each measured rank's rows scaled to the ranks' common mean,
    where they all ran unslowed at one node speed (:meth:`~.workload.Workload.pooled`),
    with a line saying so where they differed; ``each``: every rank's own.

    Why: the validation's workload is a run of the model on the same nodes as the runs,
    every rank unslowed, and on the emulated cluster neither node is slower. Over the
    homogeneous runs of four validation sets (24-72 runs a set and model), rank 0's mean
    compute over rank 1's had a median of 0.98-1.02, half of them within 0.92-1.08; of
    the fifteen workloads, three were at 0.92 (mlp), 1.12 and 1.23 (lenet), and a
    prediction replaying them per rank took that one run's difference for the nodes'
    (docs/RESULTS.md, "The validation's workload, its ranks pooled")."""
    if getattr(args, "validate_workload_ranks", "pooled") != "pooled":
        return workload
    pooled = workload.pooled()
    means = workload.rank_means()
    if pooled is not workload and max(means) > min(means):
        print(f"--workload ranks' mean compute {', '.join(f'{1e3 * m:.3f}' for m in means)} "
              f"ms: replayed at their mean, {1e3 * float(np.mean(means)):.3f} ms (their "
              f"data and update likewise), each rank's steps in their order "
              f"(--validate-workload-ranks pooled)")
    return pooled


def host_factor(run: Any, workload: Any) -> float:
    """How much slower the host computed during ``run`` than during ``workload``'s run:
    the median per-step compute of the run's ranks that were neither slowed nor throttled
    below the workload's node speed (their first two steps left out, as the replay does)
    over the workload's median; 1 where no rank qualifies or either median is not
    positive."""
    steps = free_rank_steps(run, "t_compute", workload.node_speed)
    if not len(steps):
        return 1.0
    mine, theirs = float(np.median(steps)), workload.median_compute_s()
    return mine / theirs if mine > 0 and theirs > 0 else 1.0


def rank_host_factors(run: Any, workload: Any) -> list[float] | None:
    """How much slower each of ``run``'s ranks computed than the workload's rank it
    replays: a free rank's (neither slowed nor throttled) mean per-step compute, its
    first two steps left out, over the mean compute of the workload's measured rank of
    the same number; a throttled rank's mean CPU time per step in its compute
    (:func:`cpu_per_step`) over the same, the quota's freezes not in it, where its run
    measured it; a slowed rank's (``--slowdown``) mean compute, which train times apart
    from the delay it adds (``bench/train/slowdown.py``, a multiple of the rank's own
    recent compute); a throttled rank without that column takes the free ranks' pooled
    factor (their steps' mean over the workload ranks' mean), every rank 1 where none
    is free. A workload measured at a quota (``node_speed`` below 1: the
    4-node set, every node at speed 0.5) has the quota's freezes in its compute, so a rank
    at that same speed counts as free and compares its compute's wall, not its CPU time
    (which made the 4-node lenet set's predicted compute half the measured one: 24 of 24
    configurations off, +49% to +170%, docs/RESULTS.md, "The time between a step's
    phases").
    Means, not medians: the replay keeps each row's length, so the mean is what makes a
    free rank's predicted compute its measured one, slow steps included.

    Why per rank: on a KVM guest on an Intel Xeon the two CPUs ran one model at
    different speeds within a run, by up to 1.5x, and not the same CPU faster each time
    (lenet, homogeneous, no communication: 5.06 and 3.28 ms a step in one run, 4.54 and
    5.25 in the one before); one factor per run left the faster rank's wait for the
    slower out of the prediction (docs/RESULTS.md, "Each rank's own host speed"). None
    where the run's ranks are not the workload's measured ranks one for one (the replay
    maps simulated rank i to measured rank i mod R) or the workload has no rows."""
    means = workload.rank_means()
    if not means or len(means) != len(run.ranks) or min(means) <= 0:
        return None
    workload_speed = workload.node_speed
    own: dict[int, float] = {}
    _, speeds = rank_factors(run)
    for rank, speed in zip(sorted(run.ranks), speeds):
        if speed >= workload_speed:  # free or slowed: its compute phase is its own CPU's
            steps = np.asarray(run.ranks[rank].get("t_compute", [])[2:], dtype=float)
            mean = float(np.mean(steps)) if len(steps) else 0.0
        else:  # throttled: its compute's CPU time, where the workload ran at full speed
            mean = (cpu_per_step(run, rank) if workload_speed >= 1.0 else None) or 0.0
        if mean > 0:
            own[rank] = mean
    free = free_rank_columns(run, "t_compute", workload_speed)
    steps = np.concatenate(list(free.values())) if free else np.zeros(0)
    pooled = (float(np.mean(steps)) / float(np.mean(means))
              if len(steps) and float(np.mean(steps)) > 0 else 1.0)
    return [own[rank] / theirs if rank in own else pooled
            for rank, theirs in zip(sorted(run.ranks), means)]


def host_speeds(mode: str, run: Any, workload: Any) -> tuple[float, ...]:
    """``--validate-host-speed``'s factor(s) for ``run``: ``(1,)`` for ``workload``, the
    run's one factor (:func:`host_factor`) for ``run``, each rank's
    (:func:`rank_host_factors`) for ``rank``, the run's one where those cannot be had."""
    if mode == "rank":
        factors = rank_host_factors(run, workload)
        if factors is not None:
            return tuple(factors)
    return (host_factor(run, workload),) if mode in ("run", "rank") else (1.0,)


def scaled_for_host(workload: Any, factors: tuple[float, ...], codec: float) -> Any:
    """``workload`` on the host a run met: as it is at factor 1, scaled by one factor, or
    rank by rank (:meth:`~syncbench.bench.simulate.workload.Workload.scaled_ranks`)."""
    if codec == 1.0 and all(f == 1.0 for f in factors):
        return workload
    if len(factors) > 1:
        return workload.scaled_ranks(list(factors), codec)
    return workload.scaled(factors[0], codec)


def codec_factor(run: Any, workload: Any, compute_factor: float) -> float:
    """How much slower the host ran the codec during ``run`` than during its codec
    workload's run: the mean ``t_codec`` of the run's ranks that were neither slowed nor
    throttled (their first two steps left out) over the workload's mean codec cost;
    ``compute_factor`` where either has none.

    Why its own factor: the codec streams the gradient through memory, and it slowed more
    than the compute when the host ran slow. PowerSGD on mlp (2 emulated nodes, 200
    Mbit/s) took 0.54-0.55 ms a step where the free ranks computed 0.92-0.93 ms, and
    0.81-0.94 where they computed 1.07-1.20; the workload took 0.36 and 0.81. The
    compute's ratio left the codec short (docs/RESULTS.md)."""
    steps = free_rank_steps(run, "t_codec") if workload.mean_codec_s > 0 else np.zeros(0)
    mine = float(np.mean(steps)) if len(steps) else 0.0
    return mine / workload.mean_codec_s if mine > 0 else compute_factor


def free_ranks(run: Any, speed: float = 1.0) -> list[int]:
    """The run's ranks that were neither slowed nor throttled below ``speed`` (a
    workload's own node speed: 1, or the quota it was measured at)."""
    factors, speeds = rank_factors(run)
    return [rank for rank, f, s in zip(sorted(run.ranks), factors, speeds)
            if f == 1.0 and s >= speed]


def free_rank_columns(run: Any, column: str, speed: float = 1.0) -> dict[int, np.ndarray]:
    """``column``'s per-step seconds of each of the run's ranks that were neither slowed
    nor throttled (below ``speed``, :func:`free_ranks`) and recorded it, their first two
    steps left out (as the replay does)."""
    return {rank: np.asarray(run.ranks[rank][column][2:], dtype=float)
            for rank in free_ranks(run, speed) if column in run.ranks[rank]}


def wait_cpu_share(run: Any) -> float | None:
    """The share of their waits in MPI the run's free ranks spent on the CPU: their
    ``cpu_sync`` over their ``t_comm + t_wait``, all steps together (at most 1); None where
    no free rank recorded it (a file from before the column) or none waited. It is the
    MPI library's way of waiting, the same on a throttled node, where the quota charges
    it (:data:`~syncbench.bench.simulate.quota.MPI_WAIT_CPU`)."""
    cpu = free_rank_steps(run, "cpu_sync")
    wall = free_rank_steps(run, "t_comm") + free_rank_steps(run, "t_wait")
    if not len(cpu) or len(cpu) != len(wall) or not np.all(np.isfinite(cpu)):
        return None
    total = float(wall.sum())
    return min(1.0, float(cpu.sum()) / total) if total > 0 else None


def free_rank_steps(run: Any, column: str, speed: float = 1.0) -> np.ndarray:
    """:func:`free_rank_columns` end to end; empty where no rank qualifies or none
    recorded the column."""
    steps = list(free_rank_columns(run, column, speed).values())
    return np.concatenate(steps) if steps else np.zeros(0)


def runner_labels(paths: list[str]) -> dict[str, str]:
    """Run file -> its scenario label, from the runner's ``results.json`` beside it (the
    runner's own record of each run's label, ``runs[].label`` and ``path``); a file no
    results file names is labelled by its name without ``.h5``."""
    labels: dict[str, str] = {}
    for folder in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        try:
            runs = read_results(os.path.join(folder, "results.json")).get("runs", [])
        except (OSError, ValueError):
            continue
        for run in runs if isinstance(runs, list) else []:
            if isinstance(run, dict) and "path" in run and "label" in run:
                labels[os.path.abspath(str(run["path"]))] = str(run["label"])
    return {p: labels.get(os.path.abspath(p), os.path.basename(p).removesuffix(".h5"))
            for p in paths}


def _repeats(cells: list[tuple[str, str, float]]) -> dict[tuple[str, str], list[float]]:
    """Each (label, configuration)'s repeats' errors, in the cells' order."""
    groups: dict[tuple[str, str], list[float]] = {}
    for label, config, err in cells:
        groups.setdefault((label, config), []).append(err)
    return groups


def _columns(cells: list[tuple[str, str, float]]) -> list[str]:
    """The configurations of ``cells``, homogeneous first."""
    return sorted({c for _, c, _ in cells}, key=lambda c: (c != "hom", c))


def _grid(cells: list[tuple[str, str, float]], title: str,
          text_of: Callable[[list[float]], str]) -> list[str]:
    """The table's lines of :func:`error_table` and :func:`config_table`: a row per label,
    a column per configuration (homogeneous first), each cell ``text_of`` its repeats'
    errors (``-`` where it has none)."""
    labels = list(dict.fromkeys(lbl for lbl, _, _ in cells))
    configs = _columns(cells)
    width = max([14, *(len(c) + 2 for c in configs)])
    repeats = _repeats(cells)
    lines = [f"{title:<24}" + "".join(f"{c:>{width}}" for c in configs)]
    for label in labels:
        lines.append(f"{label[:24]:<24}" + "".join(
            f"{text_of(repeats[label, c]) if (label, c) in repeats else '-':>{width}}"
            for c in configs))
    return lines


def error_table(cells: list[tuple[str, str, float]], limit: float = 0.15) -> str:
    """Prediction error per label (rows) and configuration (columns): min to max over
    the repeats, ``*`` where a repeat is off by more than ``limit``."""
    def text(errs: list[float]) -> str:
        lo, hi = min(errs), max(errs)
        span = f"{100 * lo:+.0f}%" if len(errs) == 1 else f"{100 * lo:+.0f}..{100 * hi:+.0f}%"
        return span + ("*" if max(abs(lo), abs(hi)) > limit else " ")

    lines = _grid(cells, "error (pred/meas - 1)", text)
    off = sum(1 for _, _, e in cells if abs(e) > limit)
    lines.append(f"* a repeat off by more than {100 * limit:.0f}%: {off} of {len(cells)} runs")
    return "\n".join(lines)


def geometric_error(errs: list[float]) -> float:
    """The error of repeats taken together: the geometric mean of their pred/meas, less 1.
    Each repeat is predicted from its own run file (its recorded pattern, its host
    speed), so the errors are averaged, not the samples/s; a single run is a sample of a
    noisy host (two repeats of one configuration differed by up to 45% in samples/s on
    the emulated cluster), and a configuration is what is predicted. A prediction of
    nothing (an error of -1) or a NaN makes it NaN."""
    logs = [math.log1p(e) if math.isfinite(e) and e > -1 else math.nan for e in errs]
    return math.expm1(sum(logs) / len(logs))


def config_errors(cells: list[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    """Each (label, configuration)'s :func:`geometric_error` over its repeats."""
    return {key: geometric_error(errs) for key, errs in _repeats(cells).items()}


def config_table(cells: list[tuple[str, str, float]], limit: float = 0.15) -> str:
    """:func:`config_errors` per label (rows) and configuration (columns), with the repeats'
    count; ``*`` where a configuration is off by more than ``limit``; then, per column,
    how many its repeats' spread alone would leave off (:func:`spread_lines`)."""
    def text(errs: list[float]) -> str:
        err = geometric_error(errs)
        return "-" if not math.isfinite(err) else \
            f"{100 * err:+.0f}%" + ("*" if abs(err) > limit else " ")

    lines = _grid(cells, "per configuration", text)
    errors = config_errors(cells)
    repeats = Counter((lbl, c) for lbl, c, _ in cells).values()
    counts = (f"{min(repeats)}" if min(repeats) == max(repeats)
              else f"{min(repeats)}-{max(repeats)}") if repeats else "0"
    finite = [abs(e) for e in errors.values() if math.isfinite(e)]
    off = sum(1 for e in finite if e > limit) + len(errors) - len(finite)
    mean = 100 * float(np.mean(finite)) if finite else math.nan
    lines.append(f"* off by more than {100 * limit:.0f}%: {off} of {len(errors)} configurations "
                 f"(the geometric mean of each one's {counts} repeat(s)' pred/meas); "
                 f"mean |error| {mean:.1f}%")
    return "\n".join(lines + spread_lines(cells, limit))


@dataclasses.dataclass(frozen=True)
class RepeatSpread:
    """What the repeats of one configuration column say about the measurement itself.

    ``run_sd``: the pooled (within-group, as one-way ANOVA's) standard deviation of
    ``log(pred/meas)`` within a configuration (one label, one configuration), over every
    configuration of the column with two or more repeats (``freedom``: their repeats less
    one each): each repeat is predicted from its own run file, so what differs between
    repeats is what the runs did that no prediction of the configuration can know (the
    host's load, where a quota's freezes fell). ``chance_off``: how many of the column's
    configurations a model without bias would still leave off by more than the limit, each
    one's error the mean of its ``r`` repeats' logs, normal with sd ``run_sd / sqrt(r)``;
    ``off``: how many are. Where ``off`` is near ``chance_off``, the column is at the
    resolution its repeats give; beyond it, the model is biased there."""

    config: str
    configurations: int
    freedom: int
    run_sd: float
    chance_off: float
    off: int
    limit: float = 0.15

    def chance(self, repeats: int) -> float:
        """The chance that an unbiased model's configuration of ``repeats`` repeats is off
        by more than the limit."""
        return _off_chance(self.run_sd / math.sqrt(repeats), self.limit)

    def repeats_for(self, chance: float = 0.05, most: int = 100) -> int | None:
        """The fewest repeats a configuration needs for an unbiased model to be off by
        more than the limit at most ``chance`` of the time (None: more than ``most``)."""
        return next((r for r in range(1, most + 1) if self.chance(r) <= chance), None)


def _normal_cdf(x: float, sd: float) -> float:
    return 0.5 * (1.0 + math.erf(x / (sd * math.sqrt(2.0)))) if sd > 0 else float(x >= 0)


def _off_chance(sd: float, limit: float) -> float:
    """P(a normal log error of sd ``sd`` about 0 lies beyond log(1 + limit) or below
    log(1 - limit))."""
    lo = math.log1p(-limit) if limit < 1 else -math.inf
    return 1.0 - _normal_cdf(math.log1p(limit), sd) + _normal_cdf(lo, sd)


def repeat_spread(cells: list[tuple[str, str, float]],
                  limit: float = 0.15) -> list[RepeatSpread]:
    """:class:`RepeatSpread` per configuration column (homogeneous first), from the
    repeats' errors; a column none of whose configurations has two finite repeats has
    none."""
    groups = _repeats(cells)
    out = []
    for config in _columns(cells):
        keys = [k for k in groups if k[1] == config]
        squares, freedom = 0.0, 0
        for key in keys:
            logs = [math.log1p(e) for e in groups[key] if math.isfinite(e) and e > -1]
            if len(logs) >= 2:
                mean = sum(logs) / len(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                freedom += len(logs) - 1
        if freedom == 0:
            continue
        run_sd = math.sqrt(squares / freedom)
        chance = sum(_off_chance(run_sd / math.sqrt(len(groups[k])), limit) for k in keys)
        # NaN counts as off
        off = sum(1 for k in keys if not (abs(geometric_error(groups[k])) <= limit))
        out.append(RepeatSpread(config, len(keys), freedom, run_sd, chance, off, limit))
    return out


def spread_lines(cells: list[tuple[str, str, float]], limit: float = 0.15) -> list[str]:
    """The lines under :func:`config_table`: per configuration column, the repeats'
    spread and the configurations off by more than ``limit`` against those its spread
    alone would leave off (:func:`repeat_spread`)."""
    rows = repeat_spread(cells, limit)
    if not rows:
        return []
    lines = [f"repeats' spread (a run's sd of log(pred/meas) within its configuration; "
             f"configurations off by more than {100 * limit:.0f}%, how many a model "
             f"without bias would leave off by that spread alone, and the repeats that "
             f"would make it 1 in 20):"]
    for r in rows:
        need = r.repeats_for()
        lines.append(f"  {r.config:<14} a run {100 * r.run_sd:4.1f}% ({r.freedom} degrees of "
                     f"freedom); off {r.off} of {r.configurations}, by chance "
                     f"{r.chance_off:.1f}; 1 in 20 with "
                     + (f"{need} repeat(s)" if need else "more than 100 repeats"))
    return lines


def row_note(run: Any, workload_model: str,
             host: float | tuple[float, ...]) -> tuple[str, float | None]:
    """A table row's trailing note (another model than the workload's, the run's host
    speed, each rank's where they differ, a loaded host) and the run's foreign CPU share
    where it was loaded (else None)."""
    note = "" if run.model == workload_model else f"  (model {run.model} != workload)"
    speeds = host if isinstance(host, tuple) else (host,)
    if any(f != 1.0 for f in speeds):
        shown = speeds if len(set(speeds)) > 1 else speeds[:1]
        note += "  host x" + "/".join(f"{f:.2f}" for f in shown)
    share = foreign_share(run.attrs)
    if share is None or share <= LOADED_SHARE:
        return note, None
    return note + f"  loaded {share:.0%}", share


def loaded_line(shares: list[float], runs: int) -> str:
    """The line under the table naming the runs other processes loaded
    (:func:`syncbench.analysis.context.loaded`): their errors are not the model's alone."""
    return (f"loaded: {len(shares)} of {runs} runs were measured while other processes used "
            f"more than {LOADED_SHARE:.0%} of the host's cores (up to {max(shares):.0%}, "
            "foreign_cpu_share): their errors may hold that work too")


def run_load(run: Any) -> str:
    """The higher of the run's recorded load averages (``schema.LOAD_ATTRS``), or ``-``."""
    values = []
    for name in LOAD_ATTRS:
        try:
            values.append(float(run.attrs.get(name, "")))
        except (TypeError, ValueError):
            continue
    values = [v for v in values if math.isfinite(v)]
    return f"{max(values):.1f}" if values else "-"
