"""``syncbench simulate``: collectives on SimGrid, strategies' timelines, the run file.

SimGrid's engine runs once per process, so every test that simulates runs
``python -m syncbench simulate`` (or a short script) in a subprocess. Those
tests skip without SimGrid's Python module, except when
``SYNCBENCH_REQUIRE_SIMGRID`` is set (``make test`` installs it and sets it):
then they fail.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from sim_helpers import needs_simgrid, python, simulate

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.simulate.asgd import asgd_phases
from syncbench.bench.simulate.collectives import (
    allreduce_cost_terms,
    allreduce_phases,
    choose_allreduce,
)
from syncbench.bench.simulate.platform import fat_tree_parameters, torus_parameters
from syncbench.bench.simulate.workload import from_profile, parse_stragglers

# -- without SimGrid -------------------------------------------------------------------

def test_ring_and_rabenseifner_move_the_textbook_bytes():
    # Ring: 2(N-1) steps of S/N; Rabenseifner: 2 log2 N steps moving 2(N-1)/N S in all.
    for n in (2, 5, 8, 64):
        k_l, k_b = allreduce_cost_terms(1 << 20, n, "ring")
        assert k_l == 2 * (n - 1) and k_b == pytest.approx(2 * (n - 1) / n)
    k_l, k_b = allreduce_cost_terms(1 << 20, 16, "rabenseifner")
    assert k_l == 8 and k_b == pytest.approx(2 * 15 / 16)
    # N = 6: fold 2 ranks in, 4-rank recursive doubling (2 steps), unfold.
    phases = allreduce_phases(1024, 6, "recursive-doubling")
    assert [p.pattern for p in phases] == ["fold", "xor", "xor", "unfold"]
    assert sorted(phases[1].pairs())[:2] == [(0, 2), (2, 0)]


def test_mpich_choice_by_size():
    # MPICH 4-5 (maint/tuning/coll/mpir/generic.json): recursive doubling up to 8 bytes
    # or fewer elements than pof2, reduce-scatter + allgather from there on
    assert choose_allreduce(8, 2) == "recursive-doubling"
    assert choose_allreduce(16, 2) == "rabenseifner"
    assert choose_allreduce(2048, 64) == "rabenseifner"
    assert choose_allreduce(4 * 100, 128) == "recursive-doubling"  # fewer elements than pof2


def test_asgd_layouts_send_to_the_owners():
    pull, push = asgd_phases(4000, 4, "sharded")
    assert sorted(pull[0][0].pairs()) == [(i, j) for i in range(4) for j in range(4) if i != j]
    assert pull[0][0].nbytes == 1000
    pull, push = asgd_phases(4000, 4, "single")
    assert sorted(push[0][0].pairs()) == [(1, 0), (2, 0), (3, 0)]
    pull, _ = asgd_phases(4000, 1024, "sharded")  # sampled shifts, each the whole volume
    shifts = [p for p, _ in pull if p.pattern == "shift"]
    assert [p.arg for p in shifts][0] == 1 and shifts[-1].arg == 1023 and len(shifts) <= 6
    assert sum(w for p, w in pull if p.pattern == "shift") == pytest.approx(1.0)
    assert all(p.nbytes == pytest.approx(4000 * 1023 / 1024) for p in shifts)


def test_platform_sizes_hold_every_rank():
    for hosts in (1, 2, 33, 1000, 1024, 16384):
        params, total = fat_tree_parameters(hosts)
        assert total >= hosts
        _, total = torus_parameters(hosts)
        assert total >= hosts
    assert fat_tree_parameters(16384)[0] == "2;128,128;1,128;1,1"


def test_stragglers_parse_and_reject():
    s = parse_stragglers("1/64:3x,lognormal:0.1")
    assert s.persistent_share == pytest.approx(1 / 64) and s.persistent_factor == 3
    assert s.every_sigma == pytest.approx(0.1)
    t = parse_stragglers("1/64:lognormal:1")
    assert t.transient_share == pytest.approx(1 / 64) and t.transient_sigma == 1
    for bad in ("3x", "1/64:0.5x", "gamma:2", "1/0:3x"):
        with pytest.raises(ValueError, match="--stragglers"):
            parse_stragglers(bad)


def test_flop_profiles_need_a_device():
    with pytest.raises(ValueError, match="--hardware"):
        from_profile("resnet50")
    w = from_profile("resnet50", device="h100")
    # 32 samples x 24.54 GFLOP at 40% of 989.4 TFLOP/s
    assert w.mean_compute_s == pytest.approx(32 * 24.54e9 / (0.4 * 989.4e12))
    assert w.params == 25557032


def test_without_simgrid_one_line_and_status_2():
    proc = python("""
        import sys
        sys.modules["simgrid"] = None  # import simgrid raises ImportError
        from syncbench.bench.cli import main
        sys.exit(main(["simulate", "--np", "4"]))
    """)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncbench simulate: error:")
    assert "make sim" in lines[0] and "syncbench[sim]" in lines[0]


def test_model_size_knob_for_real_runs():
    from syncbench.bench.cli import build_parser
    from syncbench.kernels.zoo import build_model

    assert build_model("mlp:256,128", (1, 28, 28), 10).size == 235146  # = mlp
    big = build_model("mlp:4096,4096", (1, 28, 28), 10).size
    assert big == 784 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10  # about 20M
    one = build_model("mlp:32", (1, 28, 28), 10)
    assert one.size == 784 * 32 + 32 + 32 * 10 + 10
    for bad in ("mlp:", "mlp:0", "mlp:a,2", "resnet"):
        with pytest.raises(ValueError, match="model"):
            build_model(bad, (1, 28, 28), 10)
    args = build_parser("train").parse_args(["train", "--model", "mlp:64,32"])
    assert args.model == "mlp:64,32"


def test_calibration_recovers_latency_and_bandwidth(tmp_path):
    from syncbench.bench.micro.comm import write_results
    from syncbench.bench.simulate.platform import calibrate, calibrated_spec

    latency, bandwidth = 5e-6, 2e9
    sizes = [1 << k for k in range(10, 25, 2)]
    rows = []
    for size in sizes:  # what MPICH's algorithms cost on 2 ranks with these parameters
        k_l, k_b = allreduce_cost_terms(size, 2)
        rows.append({"size": size, "avg_us": 1e6 * (k_l * latency + k_b * size / bandwidth)})
    path = str(tmp_path / "comm.h5")
    write_results(path, {"op": "allreduce", "world_size": 2}, rows, [])
    fitted_l, fitted_b, details = calibrate(path)
    assert fitted_l == pytest.approx(latency, rel=0.01)
    assert fitted_b == pytest.approx(bandwidth, rel=0.01)
    assert details["max_rel_error"] < 0.01
    spec = calibrated_spec(path)  # a crossbar route crosses two links
    assert spec.kind == "crossbar" and 2 * spec.latency == pytest.approx(latency, rel=0.01)
    write_results(path, {"op": "bcast", "world_size": 2}, rows, [])
    with pytest.raises(ValueError, match="--op allreduce"):
        calibrate(path)


#: A 1 Gbit/s shaped link as TCP carries it (payload B/s, each way) and one exchange.
LINK_BW, LINK_LATENCY = 119.5e6, 11e-6
SIZES = [4 << k for k in range(21)]  # 4 B .. 4 MiB, as `syncbench comm --max-size 4194304`


def _model_seconds(latency: float, bandwidth: float, n: int, nodes: int = 0) -> np.ndarray:
    from syncbench.bench.simulate.collectives import allreduce_link_terms

    terms = [allreduce_link_terms(s, n, nodes) for s in SIZES]
    return np.array([k_l * latency + k_b * s / bandwidth for (k_l, k_b), s in zip(terms, SIZES)])


@pytest.mark.parametrize("n,nodes", [(2, 0), (2, 2), (4, 4), (8, 0), (4, 2), (8, 2)])
def test_fit_recovers_known_latency_and_bandwidth(n, nodes):
    from syncbench.bench.simulate.collectives import allreduce_link_terms
    from syncbench.bench.simulate.platform import fit_link

    terms = [allreduce_link_terms(s, n, nodes) for s in SIZES]
    exact = _model_seconds(LINK_LATENCY, LINK_BW, n, nodes)
    latency, bandwidth, details = fit_link(SIZES, exact, terms)
    assert latency == pytest.approx(LINK_LATENCY, rel=0.02)
    assert bandwidth == pytest.approx(LINK_BW, rel=0.02)
    assert details["bandwidth_bound"] and details["max_rel_error_all"] < 1e-6
    assert max(details["latency_sizes"]) < 1024 <= min(details["bandwidth_sizes"])
    noisy = exact * (1 + 0.03 * np.random.default_rng(n + nodes).uniform(-1, 1, exact.size))
    latency, bandwidth, _ = fit_link(SIZES, noisy, terms)
    assert latency == pytest.approx(LINK_LATENCY, rel=0.05)
    assert bandwidth == pytest.approx(LINK_BW, rel=0.05)


def test_fit_ignores_what_a_token_bucket_lets_through_unshaped():
    """tbf's burst: sizes whose iterations fit in the bucket run at the veth's speed."""
    from syncbench.bench.simulate.collectives import allreduce_link_terms
    from syncbench.bench.simulate.platform import fit_link

    terms = [allreduce_link_terms(s, 2) for s in SIZES]
    seconds = _model_seconds(LINK_LATENCY, LINK_BW, 2)
    sizes = np.array(SIZES)
    burst = sizes <= 16384  # what this machine measured: 8-16 KiB at 134-251 MB/s
    seconds[burst] = _model_seconds(LINK_LATENCY, 4e9, 2)[burst]
    latency, bandwidth, details = fit_link(SIZES, seconds, terms)
    assert latency == pytest.approx(LINK_LATENCY, rel=0.05)
    assert bandwidth == pytest.approx(LINK_BW, rel=0.05)
    assert min(details["bandwidth_sizes"]) > 16384 and details["max_rel_error"] < 0.05
    # few iterations: most of a 32-64 KiB loop rides the burst (median at the veth's
    # speed, mean 30% fast), and TCP falls 20% short at the largest size
    means, medians = seconds.copy(), seconds.copy()
    partly = (sizes > 16384) & (sizes <= 65536)
    medians[partly] = _model_seconds(LINK_LATENCY, 4e9, 2)[partly]
    means[partly] *= 0.7
    means[-1] /= 0.8
    medians[-1] = means[-1]
    latency, bandwidth, details = fit_link(SIZES, means, terms, medians)
    assert latency == pytest.approx(LINK_LATENCY, rel=0.05)
    assert bandwidth == pytest.approx(LINK_BW, rel=0.05)
    assert min(details["bandwidth_sizes"]) > 65536
    # one relative least-squares fit over every size (what --calibrate did) is far off
    a = np.array([[k_l, k_b * s] for (k_l, k_b), s in zip(terms, SIZES)]) / seconds[:, None]
    coef = np.linalg.lstsq(a, np.ones(len(SIZES)), rcond=None)[0]
    assert abs(1 / coef[1] / LINK_BW - 1) > 0.10


def test_calibration_on_two_nodes_fits_the_node_roots_allreduce(tmp_path):
    """4 ranks on 2 nodes: only the 2 node roots' allreduce crosses the links (ch4's
    composition alpha), nbytes each way, not a flat 4-rank allreduce's 1.5 x nbytes."""
    from syncbench.bench.micro.comm import write_results
    from syncbench.bench.simulate.platform import calibrate, describe_fit

    seconds = _model_seconds(LINK_LATENCY, LINK_BW, 4, nodes=2)
    # scheduling spikes lift the small sizes' means, not their medians
    rows = [{"size": s, "avg_us": 1e6 * t * (3 if s <= 1024 else 1), "p50_us": 1e6 * t}
            for s, t in zip(SIZES, seconds)]
    path = str(tmp_path / "comm.h5")
    write_results(path, {"op": "allreduce", "world_size": 4, "nodes": 2}, rows, [])
    latency, bandwidth, details = calibrate(path)
    assert bandwidth == pytest.approx(LINK_BW, rel=0.02)
    assert latency == pytest.approx(LINK_LATENCY, rel=0.02)
    assert details["statistic"] == "p50_us" and details["nodes"] == 2
    line = describe_fit(path, (latency, bandwidth, details))
    assert "4 ranks on 2 nodes" in line and "bandwidth 119.50 MB/s" in line
    write_results(path, {"op": "allreduce", "world_size": 4}, rows, [])  # as if 4 nodes
    assert calibrate(path)[1] == pytest.approx(1.5 * LINK_BW, rel=0.02)


def test_persistent_stragglers_slow_the_share_of_ranks():
    import numpy as np

    from syncbench.bench.simulate.workload import delay_factors

    rng = np.random.default_rng(0)
    model = parse_stragglers("1/64:3x")
    factor = delay_factors(model, np.ones(1024), rng, (1024, 5))
    slow = np.flatnonzero(factor[:, 0] > 1)
    assert len(slow) == 16 and np.all(factor[slow] == 3) and np.all(factor[slow, 0] == 3)
    transient = delay_factors(parse_stragglers("1/8:lognormal:1"), np.ones(64), rng, (64, 500))
    share = float(np.mean(transient > 1))
    assert 0.10 < share < 0.15 and transient.min() == 1.0


def test_epochs_give_the_steps_train_takes():
    # 60000 samples on 7 ranks in batches of 64: 133 whole batches per shard, so 1.5
    # epochs are int(1.5 * 133) = 199 steps (flooring after the epochs would give 200).
    from types import SimpleNamespace

    from syncbench.algorithms.base import steps_per_rank
    from syncbench.bench.simulate.inputs import steps_per_rank as simulated_steps

    assert steps_per_rank(1.5, 60000, 7, 64) == 199
    assert steps_per_rank(2, 60000, 7, 64) == 266 and steps_per_rank(1e-6, 60000, 7, 64) == 1
    workload = from_profile("mlp", None, None, None)
    assert (workload.dataset_samples, workload.batch_size) == (60000, 64)
    assert simulated_steps(SimpleNamespace(steps=None, epochs=1.5), workload, 7) == 199


# -- with SimGrid ------------------------------------------------------------------------

@needs_simgrid
def test_ring_allreduce_matches_the_alpha_beta_formula():
    # Crossbar: a route crosses two private links, so its latency is 2 x the link's.
    proc = python("""
        import json
        from syncbench.bench.simulate.collectives import allreduce_phases, cost
        from syncbench.bench.simulate.engine import run_in_simgrid
        from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
        out = {}
        spec = PlatformSpec(kind="crossbar", bandwidth=5e9, latency=2e-6)
        def body(net):
            tp = lambda p: net.phase(p.key(), p.pairs, p.nbytes)
            for n, size in ((2, 1e6), (8, 8e6), (16, 64e3), (16, 64e6)):
                out[f"{n} {size}"] = cost(allreduce_phases(size, n, "ring"), tp)
        run_in_simgrid(platform_xml(spec, 16), body, 1, natural_key)
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    bandwidth, latency = 5e9, 4e-6
    for key, seconds in measured.items():
        n, size = int(key.split()[0]), float(key.split()[1])
        expected = 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency
        assert seconds == pytest.approx(expected, rel=0.05), key


@needs_simgrid
def test_ssgd_steps_at_the_slow_ranks_pace(tmp_path):
    out = tmp_path / "slow.h5"
    proc = simulate("--algorithm", "ssgd", "--np", "8", "--steps", "12",
                    "--slowdown", "1,1,1,1,1,1,1,4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    slow = run.ranks[7]
    slow_local = slow["t_data"] + slow["t_compute"] + slow["t_delay"]
    assert np.mean(slow["t_delay"]) == pytest.approx(3 * np.mean(slow["t_compute"]), rel=1e-6)
    # The run lasts at least the slow rank's local work, and every rank steps at its pace
    # (the slow rank spends its delay right before it posts its last bucket, as in
    # train, so the fast ranks wait for it in the same step).
    assert run.summary["wall_s"] >= float(np.sum(slow_local))
    slow_step = np.mean(np.diff(slow["t_start"]))
    assert slow_step >= np.mean(slow_local)
    for rank in range(7):
        cols = run.ranks[rank]
        assert np.mean(np.diff(cols["t_start"])[1:]) == pytest.approx(slow_step, rel=0.05)
        own = cols["t_data"] + cols["t_compute"] + cols["t_delay"]
        # the difference is waiting for the slow rank
        assert np.mean(cols["t_wait"][1:]) > 0.8 * np.mean(slow_local - own)
    assert np.mean(slow["t_wait"]) < 0.2 * np.mean(run.ranks[0]["t_wait"])


@needs_simgrid
def test_oscars_local_steps_are_schedules_output(tmp_path):
    from syncbench.algorithms.averagers.schedule import fit_budget, schedule, uniform_schedule

    out = tmp_path / "oscars.h5"
    proc = simulate("--algorithm", "oscars", "--np", "4", "--steps", "40", "--period", "4",
                    "--slowdown", "1,1,2,3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    n, total = 4, 40 * 4
    rounds = int(max(c["round"].max() for c in run.ranks.values())) + 1
    assert rounds >= 3
    remaining = total
    for r in range(rounds):
        first = [np.flatnonzero(run.ranks[k]["round"] == r) for k in range(n)]
        taus = [len(idx) for idx in first]
        speeds = [float(run.ranks[k]["speed"][first[k][0]]) for k in range(n)]
        plan = uniform_schedule(n, 4, 32) if r == 0 else schedule(speeds, 4, 32)
        assert taus == fit_budget(plan, remaining), f"round {r}"
        assert all(int(run.ranks[k]["local_steps"][first[k][0]]) == taus[k] for k in range(n))
        remaining -= sum(taus)
    assert remaining == 0
    # The slower the rank, the fewer its local steps after the first round.
    later = [int(np.sum(run.ranks[k]["round"] > 0)) for k in range(n)]
    assert later[0] > later[2] > later[3]


@needs_simgrid
def test_simulated_run_file_is_a_run_file(tmp_path):
    out = tmp_path / "sim.h5"
    proc = simulate("--algorithm", "asgd", "--np", "16", "--steps", "5", "--platform",
                    "dragonfly", "--stragglers", "1/4:2x", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "flows/s" in proc.stdout
    run = read_run(out)  # the same checks as a measured run
    assert run.rank_layout == schema.RANK_LAYOUT_PACKED  # the recorder's writer's layout
    assert run.attrs[schema.SIMULATED_ATTR] is True
    assert json.loads(run.attrs[schema.SIM_PLATFORM_ATTR])["kind"] == "dragonfly"
    assert json.loads(run.attrs[schema.SIM_WORKLOAD_ATTR])["params"] == 235146
    assert run.world_size == 16 and sorted(run.ranks) == list(range(16))
    assert sum(len(c["step"]) for c in run.ranks.values()) == 5 * 16  # the global budget
    for cols in run.ranks.values():
        assert set(cols) == set(schema.RANK_COLUMNS)
        assert np.all(np.diff(cols["t_start"]) > 0)
    assert len(run.eval["t"]) == 0 and math.isnan(run.summary["final_accuracy"])
    assert run.summary["samples_per_s"] > 0
    assert run.summary_extra.get("diverged") is False
    report = subprocess.run([sys.executable, "-m", "syncbench", "report", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    trace = subprocess.run([sys.executable, "-m", "syncbench", "trace", str(out), "-o",
                            str(tmp_path / "t.json")], capture_output=True, text=True,
                           timeout=120)
    assert trace.returncode == 0, trace.stderr


@needs_simgrid
@pytest.mark.parametrize("algorithm", ["ssgd", "localsgd", "odsgd", "oscars", "asgd"])
def test_every_strategy_on_a_torus_with_stragglers(algorithm, tmp_path):
    out = tmp_path / f"{algorithm}.h5"
    proc = simulate("--algorithm", algorithm, "--np", "32", "--steps", "8", "--platform",
                    "torus", "--stragglers", "1/8:lognormal:1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert run.algorithm == algorithm
    assert run.summary["wall_s"] > 0 and 0 <= run.summary["wait_fraction"] < 1


@needs_simgrid
def test_bad_input_is_one_line_and_status_2(tmp_path):
    for flags in (["--np", "0"], ["--workload", "nosuch"], ["--stragglers", "x"],
                  ["--slowdown", "1,2", "--np", "4"], ["--workload", str(tmp_path / "no.h5")]):
        proc = simulate(*flags, "--out", str(tmp_path / "x.h5"))
        assert proc.returncode == 2, flags
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("syncbench simulate: error:"), flags
        assert not (tmp_path / "x.h5").exists()


@needs_simgrid
def test_np_outside_the_simulated_range_is_one_line_at_once(tmp_path):
    proc = simulate("--np", "100000", "--steps", "1", "--out", str(tmp_path / "x.h5"),
                    timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("syncbench simulate: error: --np 100000 is outside "
                                   "1..16384 (the simulated ranks)")
    assert not (tmp_path / "x.h5").exists()


def test_a_long_simulation_says_how_far_it_is_and_a_short_one_says_nothing():
    import io
    from types import SimpleNamespace

    from syncbench.bench.simulate.ticker import Ticker

    now = [100.0]
    out = io.StringIO()
    tick = Ticker("syncbench simulate", "ssgd at 16384 ranks, 2 steps", out,
                  clock=lambda: now[0])
    network = SimpleNamespace(phases=3, flows=49152)
    for now[0] in (101.0, 104.9):  # the first seconds: nothing
        tick(network)
    assert out.getvalue() == ""
    for now[0] in (106.0, 110.0, 115.9):  # then one line every 10 s at most
        tick(network)
    network.phases, network.flows = 28, 458752
    now[0] = 176.0
    tick(network)
    assert out.getvalue().splitlines() == [
        "syncbench simulate: ssgd at 16384 ranks, 2 steps: 6s so far, 3 phases and 49,152 "
        "flows simulated (8,192 flows/s)",
        "syncbench simulate: ssgd at 16384 ranks, 2 steps: 1m16s so far, 28 phases and "
        "458,752 flows simulated (6,036 flows/s)"]


@needs_simgrid
@pytest.mark.slow
def test_sweep_simulate_writes_a_scaling_series(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "syncbench", "sweep", "--simulate", "--mode", "weak", "--np",
         "4,16", "--algorithms", "ssgd,oscars", "--out-dir", str(tmp_path), "--steps", "4",
         "--platform", "fat-tree"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for algorithm in ("ssgd", "oscars"):
        for n in (4, 16):
            run = read_run(tmp_path / f"{algorithm}-weak-np{n}-r0.h5")
            assert run.attrs[schema.SIMULATED_ATTR] is True and run.world_size == n
            assert run.attrs["scaling_mode"] == "weak"
            assert all(len(c["step"]) == 4 for c in run.ranks.values()) or algorithm == "oscars"
    # one series per algorithm: the 16-rank point has an efficiency, not "-"
    cells = [[c.strip() for c in ln.split("|")] for ln in proc.stdout.splitlines()
             if ln.startswith("| ssgd")]
    points = [c for c in cells if len(c) > 8 and c[2] == "16"]
    assert points and float(points[-1][8]) > 0  # efficiency vs the 4-rank point


@needs_simgrid
@pytest.mark.slow
def test_validate_prints_measured_and_predicted(tmp_path):
    from helpers import run_mpi

    data = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--eval-every", "0",
            "--progress", "never"]
    work, run, comm = tmp_path / "work.h5", tmp_path / "run.h5", tmp_path / "comm.h5"
    for np_, out in ((1, work), (2, run)):
        proc = run_mpi(np_, "train", "--algorithm", "ssgd", *data, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
    proc = run_mpi(2, "comm", "--op", "allreduce", "--min-size", "1024", "--max-size",
                   "1048576", "--iterations", "10", "--skip", "2", "--out", str(comm))
    assert proc.returncode == 0, proc.stderr
    proc = simulate("--validate", str(run), "--workload", str(work), "--calibrate", str(comm))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(ln.split() for ln in lines if ln.startswith("run "))
    row = [ln.split() for ln in lines if ln.startswith("run.h5")]
    assert len(row) == 1 and row[0][1] == "ssgd" and row[0][2] == "2"
    measured = float(row[0][head.index("meas/s")])
    predicted = float(row[0][head.index("pred/s")])
    error = float(row[0][head.index("err")].rstrip("%"))
    assert measured > 0 and predicted > 0
    assert error == pytest.approx(100 * (predicted / measured - 1), abs=1.0)
    assert "calibrated from" in proc.stdout and "mean |error|" in proc.stdout


def test_validate_measures_samples_per_s_on_the_clock_of_wall_s(tmp_path):
    """Evaluation pauses sit inside the rows' span but not in wall_s: the measured rate is
    the run's own samples_per_s, not samples over the span (which reads it far lower)."""
    from helpers import run_mpi

    from syncbench.bench.simulate.validate import measured_samples_per_s, row_figures

    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", "--algorithm", "ssgd", "--dataset", "synthetic",
                   "--synthetic-samples", "4096", "--epochs", "2", "--eval-every", "0.1",
                   "--progress", "never", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert measured_samples_per_s(run) == pytest.approx(run.summary["samples_per_s"])
    assert row_figures(run.ranks)["samples_per_s"] < 0.95 * run.summary["samples_per_s"]


def test_residual_blocks_carry_their_layers_flops_in_the_compute_split():
    """A ResNet's basic blocks cost their convolutions (the block's FLOPs are its layers'),
    so the simulated compute split is not all stem and head."""
    from syncbench.bench.simulate.workload import layer_flops
    from syncbench.kernels.layers import BasicBlock, all_layers
    from syncbench.kernels.zoo import build_model

    model = build_model("resnet8", (1, 28, 28), 10)
    forward, backward, _ = layer_flops(model)
    blocks = [i for i, layer in enumerate(model.layers) if isinstance(layer, BasicBlock)]
    # the first block: two 3x3 16->16 convolutions at 28x28, 2 FLOP per multiply-add
    convs = 2 * 2 * 16 * 16 * 9 * 28 * 28
    assert forward[blocks[0]] >= convs and backward[blocks[0]] >= 2 * convs
    assert sum(forward[i] for i in blocks) > 0.9 * sum(forward)
    assert len(all_layers(model.layers)) > len(model.layers)
