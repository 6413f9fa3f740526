"""The decentralized and hierarchical patterns on SimGrid (a subprocess each: SimGrid's
engine runs once per process). The patterns' rules without SimGrid:
``tests/unit/test_simulate_decentralized.py``.
"""

from __future__ import annotations

import json

import pytest
from sim_helpers import needs_simgrid, python, simulate

from syncbench.analysis.runfile import read_run


@needs_simgrid
def test_gossip_on_a_ring_scales_weakly_where_the_allreduce_does_not():
    """Weak scaling, 8 -> 1024 ranks on the default fat tree (100 Gb/s, 1 us a hop), the
    mlp profile's work per rank: D-PSGD's ring exchange and its ranks' mean step time
    stay put (each rank talks to two neighbours and waits for them only, whatever N),
    while SSGD's blocking allreduce takes longer (2 log2 N latencies, a deeper tree, and
    every rank waits for the slowest of N). What N adds to a step is compared, not the
    steps: at 100 Gb/s the mlp's allreduce is shorter than D-PSGD's mix of its neighbours'
    models (local work, the same at any N)."""
    proc = python("""
        import json
        from syncbench.bench.cli import build_parser
        from syncbench.bench.simulate.inputs import build_platform, build_workload
        from syncbench.bench.simulate.run import simulate
        from syncbench.bench.simulate.workload import parse_stragglers

        def cfg(*flags):
            return build_parser("simulate").parse_args(["simulate", "--steps", "4", *flags])

        def mean_step(timeline):
            ranks = timeline.rows.arrays().values()
            phases = ("data", "compute", "comm", "wait", "update", "delay")
            return sum(sum(float(r[f"t_{p}"].sum()) for p in phases) for r in ranks) / (
                4 * len(ranks))

        base = cfg()
        spec, xml = build_platform(base)
        gossip, ssgd = cfg("--algorithm", "dpsgd"), cfg("--comm", "blocking")
        jobs = [(gossip, 8, 4), (gossip, 1024, 4), (ssgd, 8, 4), (ssgd, 1024, 4)]
        results = simulate(base, jobs, spec, xml, build_workload(base), parse_stragglers(None))
        out = [mean_step(r.timeline) for r in results]
        out += [r.timeline.notes["exchange_s"][0] for r in results[:2]]
        out += [r.summary["comm_fraction"] for r in results[2:]]
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    g8, g1024, s8, s1024, x8, x1024, c8, c1024 = json.loads(
        proc.stdout.strip().splitlines()[-1])
    assert x1024 / x8 < 1.1  # the exchange: a few more hops at the tree's top, no more
    assert g1024 / g8 < 1.02  # hidden behind compute; neighbours' pace only
    assert s1024 / s8 > 1.05 and c1024 > 1.2 * c8  # the allreduce's share grows
    assert g1024 - g8 < 0.1 * (s1024 - s8)


@needs_simgrid
@pytest.mark.parametrize("flags", [("--algorithm", "dpsgd", "--graph", "onepeer-exp"),
                                   ("--algorithm", "hierarchical", "--gpus-per-node", "4"),
                                   ("--comm", "hierarchical", "--gpus-per-node", "4")])
def test_the_new_patterns_write_run_files(flags, tmp_path):
    out = tmp_path / "run.h5"
    proc = simulate(*flags, "--np", "32", "--steps", "8", "--platform", "torus",
                    "--stragglers", "1/8:lognormal:1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert run.world_size == 32 and len(run.ranks) == 32
    assert run.summary["wall_s"] > 0 and 0 <= run.summary["wait_fraction"] < 1


@needs_simgrid
@pytest.mark.parametrize("flags,message", [
    (("--algorithm", "hierarchical", "--np", "4", "--gpus-per-node", "4"),
     "hierarchical averaging needs 2 or more nodes"),
    (("--algorithm", "dpsgd", "--np", "7", "--graph", "torus"), "torus does not fit 7 ranks"),
])
def test_bad_input_is_one_line(flags, message, tmp_path):
    proc = simulate(*flags, "--out", str(tmp_path / "x.h5"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench simulate: error:")
    assert message in lines[0] and not (tmp_path / "x.h5").exists()


@needs_simgrid
def test_adpsgd_pattern_on_simgrid():
    """The ``adpsgd`` pattern (no strategy registers it here: called directly) on the
    default fat tree: the model's transfer takes its bytes at the link's rate plus the
    route's latency, and every active rank averages once per step."""
    proc = python("""
        import json
        from syncbench.bench.cli import build_parser
        from syncbench.bench.simulate.collectives import PlacedClock
        from syncbench.bench.simulate.engine import run_in_simgrid
        from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
        from syncbench.bench.simulate.strategies import SIMULATORS
        from syncbench.bench.simulate.timeline import LocalTimes
        from syncbench.bench.simulate.workload import Stragglers, from_profile

        cfg = build_parser("simulate").parse_args(["simulate", "--graph", "exp"])
        w = from_profile("mlp")
        def body(net):
            clock = PlacedClock(lambda p: net.phase(p.key(), p.pairs, p.nbytes), 1)
            t = SIMULATORS["adpsgd"](cfg, LocalTimes(w, 64, [1.0] * 64, Stragglers(), 0), 5,
                                     clock)
            rows = t.rows.arrays()
            return {**t.notes, "steps": [len(rows[k]["step"]) for k in rows],
                    "bytes": w.param_bytes}
        out, _, _ = run_in_simgrid(platform_xml(PlatformSpec(), 64), body, 1, natural_key)
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert notes["steps"] == [5] * 64 and notes["averages"] == 32 * 5
    alone = notes["bytes"] / 12.5e9
    assert alone < notes["model_transfer_s"] < alone + 10e-6
    assert 1e-6 <= notes["one_way_latency_s"] < 10e-6
