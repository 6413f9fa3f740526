"""``syncbench simulate``: predict a strategy at N ranks on a simulated cluster (SimGrid).

Examples::

    syncbench simulate --algorithm ssgd --np 1024 --steps 20 --out sim.h5
    syncbench simulate --algorithm oscars --np 4096 --workload resnet50 --hardware h100 \\
        --platform dragonfly --stragglers 1/64:lognormal:1 --out osc.h5
    syncbench simulate --validate run-np2.h5 run-np4.h5 --workload one-rank.h5 \\
        --calibrate comm.h5

The workload is a measured run file or a named profile (``mlp`` default),
the platform a fat tree (default), a dragonfly, a torus, a SimGrid XML file,
or this machine fitted from ``syncbench comm --op allreduce`` results
(``--calibrate``). The output is a ``syncbench/1`` run file with
``simulated=True``: ``report``, ``trace`` and the plots read it unchanged.
The strategy flags are train's (``--period``, ``--bucket-mb``, ``--comm``,
``--ps-layout``, ...). How time is modelled: docs/DESIGN.md, "The
simulator".
"""

from __future__ import annotations

import argparse
import sys

# syncbench's parser imports this module with MPI not started
# (``bench.cli.mpi_not_started``), so the strategies' modules do not initialise MPI.
from syncbench.algorithms.flags import add_option_flags
from syncbench.algorithms.local_optimizer import LOCAL_OPTIMIZERS
from syncbench.algorithms.registry import ALGORITHMS
from syncbench.bench.flags import OnOffAsSwitches, renamed
from syncbench.bench.simulate.asgd import add_arguments as asgd_arguments
from syncbench.bench.simulate.collectives import ALLREDUCE_ALGORITHMS
from syncbench.bench.simulate.compressed import add_arguments as compressed_arguments
from syncbench.bench.simulate.engine import SimGridMissing, load_simgrid
from syncbench.bench.simulate.platform import KINDS
from syncbench.bench.simulate.single import run_single
from syncbench.bench.simulate.strategies import simulated_strategies
from syncbench.bench.simulate.validate import validate_main
from syncbench.bench.simulate.validate_pool import pool_main

HELP = "predict a strategy at 8 to 16,384 ranks on a simulated cluster (SimGrid)"


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    """``syncbench simulate``'s workload flags."""
    wl = parser.add_argument_group("workload")
    wl.add_argument("--workload", default="mlp",
                    help="a measured run file (RUN.h5) or a profile: mlp (default), lenet, "
                    "resnet50, vgg16, bert-base, gpt2-small")
    # The old spellings --device, --device-flops: --device is train's compute device.
    renamed(wl, ("--device",), "--hardware", default=None, dest="sim_device", metavar="NAME",
            help="hardware whose peak FLOP/s runs a FLOP-based profile (h100, a100, v100)")
    renamed(wl, ("--device-flops",), "--hardware-flops", type=float, default=None,
            dest="device_flops", metavar="FLOPS", help="sustained FLOP/s of the hardware for "
            "FLOP-based profiles (instead of --hardware)")
    wl.add_argument("--efficiency", type=float, default=None,
                    help="share of the named hardware's peak reached (default: the profile's)")
    wl.add_argument("--compute-split", default="auto", choices=("auto", "timed", "flops"),
                    help="where a measured run's hook calls fall in its compute: timed on "
                    "this host (the model's own steps), or from each layer's FLOPs; auto "
                    "(default): timed with --validate (runs of this host), FLOPs otherwise")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench simulate`` (the strategies' own flags come from the registry;
    ``--algorithm``: every registered strategy whose communication pattern is simulated)."""
    run = parser.add_argument_group("run")
    run.add_argument("--algorithm", default="ssgd", choices=tuple(simulated_strategies()),
                     help="synchronization strategy (default ssgd)")
    run.add_argument("--np", type=int, default=8, help="simulated ranks (default 8)")
    run.add_argument("--steps", type=int, default=None,
                     help="steps per rank (global budget: steps x np local steps)")
    run.add_argument("--epochs", type=float, default=None,
                     help="passes over the workload's dataset instead of --steps "
                     "(default: --steps 20)")
    run.add_argument("--batch-size", type=int, default=None,
                     help="per-rank batch (default: the workload's)")
    run.add_argument("--out", default=None, help="run file to write (HDF5, syncbench/1)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    run.add_argument("--seed", type=int, default=0, help="seed of step times and stragglers")
    run.add_argument("--optimizer", default=None, choices=LOCAL_OPTIMIZERS,
                     help="the local optimizer the simulated ranks step with (default: the "
                     "strategy's, as train's); where the --workload run stepped with another, "
                     "its update is scaled by the two steps' times on this host")
    run.add_argument("--scaling-mode", default=None, choices=("strong", "weak"),
                     help="record the run as part of a strong or weak scaling study "
                     "(root attribute scaling_mode; syncbench sweep --simulate sets it)")

    _workload_arguments(parser)

    pf = parser.add_argument_group("platform")
    pf.add_argument("--platform", default="fat-tree", choices=KINDS,
                    help="simulated cluster topology (default fat-tree)")
    pf.add_argument("--platform-xml", default=None, metavar="FILE",
                    help="a SimGrid platform file (its hosts take the ranks in name order)")
    pf.add_argument("--calibrate", default=None, metavar="COMM.h5",
                    help="this machine: latency and bandwidth fitted to `syncbench comm "
                    "--op allreduce --out` results")
    pf.add_argument("--hosts", type=int, default=0, help="hosts (default: as the ranks need)")
    pf.add_argument("--bandwidth", type=float, default=12.5,
                    help="host link bandwidth in GB/s (default 12.5 = 100 Gb/s)")
    pf.add_argument("--latency", type=float, default=1.0,
                    help="link latency per hop in microseconds (default 1)")
    pf.add_argument("--gpus-per-node", type=int, default=1, help="ranks per host (default 1)")
    pf.add_argument("--allreduce", default="auto", choices=ALLREDUCE_ALGORITHMS,
                    help="allreduce algorithm (default auto: MPICH's choice by size)")
    pf.add_argument("--link-burst", default=None, metavar="SIZE",
                    help="a token bucket on every link: a blocking collective after "
                    "compute sends its first SIZE bytes per flow at once (e.g. 256kb, the "
                    "emulated cluster's tc tbf at 1 Gbit/s; default none; --validate reads "
                    "the runs' own)")
    pf.add_argument("--link-cpu", default=None, type=float, metavar="NS",
                    help="host CPU (interrupts) per byte a rank sends, in ns, taken from its "
                    "compute while its D-PSGD exchange is in flight (default: the --calibrate "
                    "file's, which syncbench comm records; else 0)")
    pf.add_argument("--phase-cache", default=None, metavar="FILE.json",
                    help="reuse and store simulated phase durations (same platform only), "
                    "e.g. across the points of a sweep")

    het = parser.add_argument_group("heterogeneity")
    het.add_argument("--slowdown", default=None,
                     help="per-rank slowdown factors as in train, e.g. 1,4")
    het.add_argument("--node-speed", default=None, metavar="S1,S2,...",
                     help="per-rank CPU share of a node at a quota, as the emulated "
                     "cluster's --node-speed (e.g. 1,0.5): compute, data and update are "
                     "slowed by 1/S (a wait inside MPI is not: the kernel moves the bytes)")
    het.add_argument("--node-throttle", default=None, metavar="ON/OFF[/LO-HI][,...]",
                     help="how the kernel realises each --node-speed below 1: ON ms of "
                     "running then OFF ms frozen, and optionally LO-HI, the 10th and 90th "
                     "percentiles of the first run after an idle spell (else ON) (e.g. "
                     "3.1/4.9/2.2-5.0, about what syncbench cluster measures on its slow "
                     "nodes), for every such rank or one entry (or -) per rank; the ranks' "
                     "shares then follow from their busy and idle times, not from the "
                     "nominal speed (--validate reads the runs' own)")
    het.add_argument("--node-wait-cpu", default=None, metavar="F",
                     help="with --node-throttle: the share of a wait in MPI a rank at a quota "
                     "stays on the CPU, polling, which the quota charges (default 1: MPICH's "
                     "waits poll all along; 0: a wait sleeps and refills the quota; "
                     "--validate takes the runs' free ranks' own where recorded)")
    het.add_argument("--stragglers", default=None,
                     help="random stragglers: lognormal:SIGMA, P/Q:Fx (e.g. 1/64:3x) or "
                     "P/Q:lognormal:SIGMA, comma-separated")

    asgd_arguments(parser)  # ASGD's RMA costs
    compressed_arguments(parser)  # the codec's work of ssgd --compress

    val = parser.add_argument_group("validation")
    val.add_argument("--validate", nargs="+", default=None, metavar="RUN.h5",
                     help="simulate each measured run's configuration (workload from "
                     "--workload, network from --calibrate) and print measured vs predicted")
    val.add_argument("--compressed-workload", action="append", default=None,
                     metavar="RUN.h5",
                     help="a 1-rank run of the same model with --compress C (repeatable, one "
                     "per codec): runs with that codec take their codec's cost from its mean "
                     "t_codec, what the reducer's encoding and decoding cost in a real step, "
                     "and their step times from --workload")
    val.add_argument("--quota-workload", action="append", default=None, metavar="RUN.h5",
                     help="(repeatable: the mean) a run of the same model in which a rank "
                     "computed on a node at a "
                     "quota and no rank communicated (Local SGD with a period longer than "
                     "the run): the share of the CPU its throttled rank realised over its "
                     "step (its compute's CPU time and the free ranks' data and update, "
                     "over the step's wall) against its node speed is the quota's "
                     "efficiency on this model, and every throttled rank is simulated at "
                     "its node speed times it (its pattern's frozen span set to match)")
    val.add_argument("--validate-realised", action="store_true",
                     help="simulate a slowed run with the slowdown each rank realised "
                     "(its slowdown_realised) instead of the nominal factor or node speed: "
                     "what is left is the simulator's own error")
    val.add_argument("--validate-host-speed", choices=("workload", "run", "rank"),
                     default="workload",
                     help="the host's speed in each prediction: the workload's (default); "
                     "each run's own (run), the workload scaled by the median compute of the "
                     "run's ranks that were neither slowed nor throttled over the workload's "
                     "(a host whose CPU speed moved between the runs; compute that a "
                     "strategy's own traffic inflates is then taken as the host's); or each "
                     "rank's own (rank), every free or slowed rank's workload rows scaled "
                     "by its mean compute over its workload rank's, a throttled rank by its "
                     "compute's CPU time where recorded, else by the free ranks' (a host "
                     "whose CPUs ran at different speeds within a run; "
                     "the run's one factor where its ranks are not the workload's one for "
                     "one); a compressed run's codec cost is scaled by its free ranks' mean "
                     "codec time over the codec workload's")
    val.add_argument("--validate-workload-ranks", choices=("pooled", "each"),
                     default="pooled",
                     help="the --workload's measured ranks: pooled (default), each rank's "
                     "rows (data, compute, update) scaled to the mean of the ranks' means "
                     "where every rank ran unslowed at one node speed, as the validation's "
                     "nodes are alike; each: every simulated rank replays its measured "
                     "rank's own")
    val.add_argument("--validate-csv", default=None, metavar="FILE.csv",
                     help="also write each validated run's row (run, model, label, "
                     "configuration, measured and predicted samples/s) as CSV, what "
                     "--validate-pool pools")
    val.add_argument("--validate-pool", nargs="+", default=None, metavar="FILE.csv",
                     help="instead of simulating: pool the --validate-csv tables of several "
                     "validation sets (one link rate) and print each configuration's error "
                     "over all their repeats and in how many sets it was off on its own "
                     "(needs no SimGrid)")
    val.add_argument("--validate-out", default=None, metavar="DIR",
                     help="also write each prediction as a run file, DIR/predicted-NAME.h5 "
                     "(syncbench trace MEASURED.h5 --beside it draws the two side by side; "
                     "--overwrite replaces existing ones)")

    seen: dict = {}  # flags shared by strategies are added once, as in train
    for cls in ALGORITHMS.values():
        group = parser.add_argument_group(f"{cls.name} (as in train)")
        add_option_flags(OnOffAsSwitches(group), cls.Options, seen)  # on/off options: --x/--no-x


def _fail(message: str) -> int:
    print(f"syncbench simulate: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench simulate``: 0 on success, 2 on bad input or without SimGrid."""
    if args.validate_pool:
        given = [flag for flag, value in (("--validate", args.validate),
                                          ("--validate-csv", args.validate_csv),
                                          ("--validate-out", args.validate_out)) if value]
        if given:
            return _fail(f"--validate-pool pools tables already made: give it without "
                         f"{given[0]}")
        try:
            return pool_main(args)
        except ValueError as exc:
            return _fail(str(exc))
    try:
        load_simgrid()
    except SimGridMissing as exc:
        return _fail(str(exc))
    if args.validate_csv and not args.validate:
        return _fail("--validate-csv keeps the rows of a --validate: give it with --validate")
    try:
        if args.validate:
            return validate_main(args)
        return run_single(args)
    except ValueError as exc:
        return _fail(str(exc))
