"""``syncbench simulate``: collectives on SimGrid, strategies' timelines, the run file.

SimGrid's engine runs once per process, so every test that simulates runs
``python -m syncbench simulate`` (or a short script) in a subprocess. Those
tests skip without SimGrid's Python module, except when
``SYNCBENCH_REQUIRE_SIMGRID`` is set (``make test`` installs it and sets it):
then they fail.

Split off this module: ``tests/e2e/test_simulate_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest

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


def test_a_measured_profile_replays_its_time_between_phases_with_its_data():
    """profiles.toml's mlp and lenet carry a step's time outside its phases, which a
    simulated rank does with its data (as a run file's rows do); a FLOP profile has none."""
    from syncbench.bench.simulate.workload import load_profiles

    for name in ("mlp", "lenet"):
        p = load_profiles()["model"][name]
        assert p["between_seconds"] > 0
        assert from_profile(name).mean_data_s == pytest.approx(
            p["data_seconds"] + p["between_seconds"])
    assert from_profile("resnet50", device="h100").mean_data_s == 0.0


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


def test_the_time_left_is_the_pace_since_the_last_new_phase():
    """The estimate extrapolates only steps over cached phases: none before such a step."""
    from syncbench.bench.simulate.ticker import estimate_left

    assert estimate_left(10.0, 5, 20) == 40.0  # 2 s per step, 20 steps left
    assert estimate_left(3.0, 4, 0) == 0.0 and estimate_left(3.0, 4, -2) == 0.0
    assert estimate_left(10.0, 0, 20) is None  # no step since the last new phase
    assert estimate_left(-1.0, 3, 20) is None


def test_the_progress_line_gives_the_step_and_an_estimate_only_once_it_can():
    """With the steps in all, the line gives the step reached and "estimate unknown" until
    a step ran after the last new phase, then the pace since that phase times the steps
    left; a new phase makes it unknown again."""
    import io
    from types import SimpleNamespace

    from syncbench.bench.simulate.ticker import Ticker

    now = [100.0]
    out = io.StringIO()
    tick = Ticker("syncbench simulate", "oscars at 4096 ranks, 100 steps", out,
                  clock=lambda: now[0], total_steps=100)
    network = SimpleNamespace(phases=0, flows=0)
    for now[0], phases, flows, step in ((101.0, 3, 3000, 0), (106.0, 3, 3000, 0),
                                        (110.0, 3, 3000, 10), (116.0, 3, 3000, 30),
                                        (120.0, 4, 4000, 31), (126.0, 4, 4000, 31),
                                        (136.0, 4, 4000, 41)):
        network.phases, network.flows = phases, flows
        tick(network, step)
    tail = [line.split("; ", 1)[1] for line in out.getvalue().splitlines()]
    # 106: no step since the phases of 101; 116: 30 steps in 15 s, 70 left; 126: a new
    # phase at 120; 136: 10 steps in 16 s since it, 59 left
    assert tail == ["step 0 of 100, estimate unknown", "step 30 of 100, about 35s left",
                    "step 31 of 100, estimate unknown", "step 41 of 100, about 1m34s left"]


def test_local_times_tell_each_step_further_than_any_before():
    """The strategies ask their local times step by step (every rank, some ranks, one
    rank): the progress line hears of each further step once, whatever the loop."""
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import Stragglers

    local = LocalTimes(from_profile("mlp", None, None, None), 2, [1.0, 1.0], Stragglers(), 0)
    told: list[int] = []
    local.on_step = told.append
    local.step(0)
    local.step(1)
    local.step(1)
    local.steps(np.array([0, 1]), np.array([3, 2]))
    local.rank(0, 2)
    local.rank(1, 5)
    assert told == [1, 3, 5] and local.reached == 5


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
