"""Simulated seconds per step of SSGD's allreduce and D-PSGD's gossip, side by side.

Lian et al. (NeurIPS 2017, arXiv 1705.09056, Sec. 5) report D-PSGD up to 10x faster
than centralized SGD on a slow network. This prints, per rank count, the seconds per
step of SSGD (``--comm blocking`` with MPICH's allreduce and with the ring allreduce,
and ``--comm overlap``) and of D-PSGD on ``--graph`` (default ring), and D-PSGD's
speedup over each, all simulated in one SimGrid engine (phases shared) on the platform
that the flags after ``--`` describe (``syncbench simulate``'s own flags)::

    python tools/dpsgd_vs_ssgd.py --np 8,64,512,4096,16384 --steps 4 -- \\
        --platform crossbar --bandwidth 0.125 --latency 500

(a crossbar route crosses two host links: 1 Gbit/s and 1 ms one way).
"""

from __future__ import annotations

import argparse
import sys

from syncbench.bench.cli import build_parser
from syncbench.bench.simulate.inputs import build_platform, build_workload
from syncbench.bench.simulate.run import simulate
from syncbench.bench.simulate.workload import parse_stragglers

#: (column, flags of ``syncbench simulate``) of each configuration compared.
CONFIGS = (
    ("ssgd blocking (MPICH)", ("--algorithm", "ssgd", "--comm", "blocking")),
    ("ssgd blocking (ring)", ("--algorithm", "ssgd", "--comm", "blocking",
                              "--allreduce", "ring")),
    ("ssgd overlap", ("--algorithm", "ssgd", "--comm", "overlap")),
)


def main(argv: list[str]) -> int:
    own, _, rest = (argv[:argv.index("--")], None, argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, None, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", default="8,64,512,4096,16384")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--graph", default="ring")
    args = parser.parse_args(own)
    sizes = [int(v) for v in args.np.split(",")]

    def config(*flags: str) -> argparse.Namespace:
        return build_parser("simulate").parse_args(
            ["simulate", *rest, "--steps", str(args.steps), *flags])

    base = config()
    spec, xml = build_platform(base)
    workload = build_workload(base)
    gossip = ("--algorithm", "dpsgd", "--graph", args.graph)
    jobs = [(config(*flags), n, args.steps) for n in sizes
            for flags in [*(f for _, f in CONFIGS), gossip]]
    results = simulate(base, jobs, spec, xml, workload, parse_stragglers(None))
    per = len(CONFIGS) + 1
    print(f"platform {spec.kind}: {spec.bandwidth * 8 / 1e9:g} Gbit/s, latency "
          f"{spec.latency * 1e6:g} us per link; workload {workload.name} "
          f"({workload.params} parameters); {args.steps} steps; ms per step")
    heads = [name for name, _ in CONFIGS]
    print("| N | " + " | ".join(heads) + f" | dpsgd {args.graph} | "
          + " | ".join(f"speedup vs {h}" for h in heads) + " |")
    print("|---" * (2 + 2 * len(heads)) + "|")
    for i, n in enumerate(sizes):
        ms = [1e3 * r.timeline.wall_s / args.steps for r in results[i * per:(i + 1) * per]]
        print(f"| {n} | " + " | ".join(f"{v:.3f}" for v in ms) + " | "
              + " | ".join(f"{v / ms[-1]:.2f}x" for v in ms[:-1]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
