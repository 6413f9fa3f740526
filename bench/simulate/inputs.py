"""What a simulation is made of, from ``syncbench simulate``'s flags: platform, workload, steps.

Shared by the command (:mod:`.cli`) and ``--validate`` (:mod:`.validate`): the
simulated cluster (:mod:`.platform`: a generated topology, a SimGrid XML file, or
this machine calibrated from ``syncbench comm`` results), the per-step work
(:mod:`.workload`: a measured run file or a named profile, at ``--batch-size``),
and the steps per rank (``--steps``, or ``--epochs`` counted as train counts them).
"""

from __future__ import annotations

import argparse
import functools
import math

from syncbench.algorithms.base import steps_per_rank as epoch_steps
from syncbench.bench.micro.comm import read_results
from syncbench.bench.simulate import platform as pf
from syncbench.bench.simulate import workload as wl


def build_platform(args: argparse.Namespace) -> tuple[pf.PlatformSpec, str]:
    """(PlatformSpec, XML text) from the flags."""
    if args.gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if args.calibrate:
        fit = pf.calibrate(args.calibrate)
        print(pf.describe_fit(args.calibrate, fit), flush=True)
        spec = pf.calibrated_spec(args.calibrate, args.gpus_per_node, fit)
    elif args.platform_xml:
        spec = pf.PlatformSpec(kind="xml", xml_file=args.platform_xml,
                               gpus_per_node=args.gpus_per_node)
        return spec, pf.read_platform_xml(args.platform_xml)
    else:
        if args.bandwidth <= 0 or args.latency < 0:
            raise ValueError("--bandwidth must be > 0 and --latency >= 0")
        spec = pf.PlatformSpec(kind=args.platform, hosts=args.hosts,
                               bandwidth=args.bandwidth * 1e9, latency=args.latency * 1e-6,
                               gpus_per_node=args.gpus_per_node)
    return spec, ""


def build_workload(args: argparse.Namespace) -> wl.Workload:
    """The workload of ``--workload`` (a run file or a profile), at ``--batch-size``."""
    name = args.workload
    if name.endswith((".h5", ".hdf5")) or "/" in name:
        w = wl.from_run(name)
    else:
        w = wl.from_profile(name, args.sim_device, args.device_flops, args.efficiency)
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        scale = args.batch_size / w.batch_size
        w.batch_size = args.batch_size
        if w.rows is not None:
            w.rows = w.rows * [1.0, scale, 1.0]
        else:
            w.mean_compute_s *= scale
    if w.rows is not None and compute_split_mode(args) == "timed":  # at the batch simulated
        refusal = wl.timed_split_refusal(w)
        if refusal is None:
            w = wl.with_timed_split(w)
        elif getattr(args, "compute_split", "auto") == "timed":
            print(f"--compute-split timed: {refusal}; the FLOP split instead", flush=True)
    return w


def compute_split_mode(args: argparse.Namespace) -> str:
    """``timed`` or ``flops``: ``--compute-split``, where ``auto`` is ``timed`` for a
    ``--validate`` (its runs were measured on this host, as the validation script makes
    them) and ``flops`` otherwise (a run file from another machine)."""
    mode = str(getattr(args, "compute_split", "auto") or "auto")
    if mode == "auto":
        return "timed" if getattr(args, "validate", None) else "flops"
    return mode


def steps_per_rank(args: argparse.Namespace, workload: wl.Workload, n: int) -> int:
    """Steps per rank: ``--steps``, or ``--epochs`` over the workload's dataset as train counts."""
    if args.steps is not None and args.epochs is not None:
        raise ValueError("give --steps or --epochs, not both")
    if args.epochs is not None:
        if args.epochs <= 0:
            raise ValueError(f"--epochs must be > 0, got {args.epochs}")
        return epoch_steps(args.epochs, workload.dataset_samples, n, workload.batch_size)
    steps = 20 if args.steps is None else args.steps
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    return steps


def link_cpu(cfg: argparse.Namespace) -> float:
    """Seconds of host CPU per byte a rank sends (:mod:`~syncbench.bench.micro.link_cpu`):
    ``--link-cpu`` (ns), else the ``--calibrate`` file's record, else 0."""
    value = getattr(cfg, "link_cpu", None)
    if value is not None:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--link-cpu {value:g} must be a number of ns >= 0")
        return float(value) * 1e-9
    path = getattr(cfg, "calibrate", None)
    return recorded_link_cpu(path) if path else 0.0


@functools.lru_cache(maxsize=8)
def recorded_link_cpu(path: str) -> float:
    """The ``link_cpu_s_per_byte`` a ``syncbench comm`` results file recorded (0: none)."""
    try:
        value = float(read_results(path)["attrs"].get("link_cpu_s_per_byte", math.nan))
    except (OSError, KeyError, TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0
