"""``simulate --validate``: the configuration simulated for a measured run."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from test_analysis import make_rank, write_file

from syncbench.analysis.runfile import read_run
from syncbench.bench.simulate.validate import _job, configuration, rank_factors


def test_a_node_slowed_by_its_cpu_quota_is_simulated_as_slowed(tmp_path):
    """The emulated cluster's CPU quota is no train flag: the run file's rank attribute
    node_speed goes to the simulated configuration as --node-speed, beside --slowdown's
    factors, and names the run's configuration."""
    quota = write_file(tmp_path / "q.h5", algorithm="ssgd", world_size=2, wall=2.0,
                       steps_per_rank=4, rank_extra={1: {"node_speed": 0.25}})
    both = write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=2, wall=2.0,
                      steps_per_rank=4, config={"slowdown": "1,2"},
                      rank_extra={0: {"slowdown": 1.0}, 1: {"slowdown": 2.0,
                                                           "node_speed": 0.5}})
    plain = write_file(tmp_path / "p.h5", algorithm="ssgd", world_size=2, wall=2.0,
                       steps_per_rank=4)
    assert rank_factors(read_run(quota)) == ([1.0, 1.0], [1.0, 0.25])
    assert rank_factors(read_run(both)) == ([1.0, 2.0], [1.0, 0.5])
    assert rank_factors(read_run(plain)) == ([1.0, 1.0], [1.0, 1.0])
    cfg, n, steps = _job(argparse.Namespace(slowdown=None, algorithm="ssgd"), read_run(quota))
    # the quota goes to the simulator as a node speed (it slows MPI too), not a --slowdown
    assert (cfg.slowdown, cfg.node_speed, n, steps) == (None, "1,0.25", 2, 4)
    cfg, _, _ = _job(argparse.Namespace(slowdown=None, algorithm="ssgd"), read_run(both))
    assert (cfg.slowdown, cfg.node_speed) == ("1,2", "1,0.5")
    assert [configuration(read_run(f)) for f in (quota, both, plain)] == \
        ["quota 0.25", "slow 2x quota 0.5", "hom"]


def test_a_runs_label_is_the_runners_own_record(tmp_path):
    """The error table groups runs by the label the runner wrote in results.json beside
    them (a label may hold dashes, a configuration key may end in -npN); a run no results
    file names is labelled by its file name."""
    import json

    from syncbench.bench.simulate.validate import runner_labels

    named = tmp_path / "ssgd-blocking-q1-0.5-np2-r0.h5"
    loose = tmp_path / "other" / "mine.h5"
    (tmp_path / "results.json").write_text(json.dumps(
        {"runs": [{"label": "ssgd-blocking", "path": named.name}]}))
    assert runner_labels([str(named), str(loose)]) == {str(named): "ssgd-blocking",
                                                       str(loose): "mine"}


def test_node_speeds_are_taken_relative_to_the_workloads_node(tmp_path):
    """A workload measured on a node at speed 0.5 holds what that share does to a step:
    runs on such nodes are simulated at speed 1, a slower node at its ratio, and a rank
    on a faster node than the workload's is one line naming both speeds."""
    import pytest

    from syncbench.bench.simulate.validate import relative_speeds

    half = write_file(tmp_path / "h.h5", algorithm="dpsgd", world_size=2, wall=2.0,
                      steps_per_rank=4, rank_extra={0: {"node_speed": 0.5},
                                                   1: {"node_speed": 0.5}})
    run = read_run(half)
    speeds = rank_factors(run)[1]
    assert relative_speeds(run, speeds, 1.0) == [0.5, 0.5]
    assert relative_speeds(run, speeds, 0.5) == [1.0, 1.0]
    assert relative_speeds(run, [0.5, 0.25], 0.5) == [1.0, 0.5]
    cfg, _, _ = _job(argparse.Namespace(slowdown=None, algorithm="dpsgd"), run, 0.5)
    assert cfg.node_speed is None
    from syncbench.bench.simulate.workload import measured_node_speed
    assert measured_node_speed(run) == 0.5
    assert measured_node_speed(read_run(write_file(tmp_path / "f.h5", algorithm="ssgd",
                                                   world_size=1, wall=1.0,
                                                   steps_per_rank=4))) == 1.0
    faster = r"speed 0\.5, faster than the --workload's node \(0\.25\)"
    with pytest.raises(ValueError, match=faster):
        relative_speeds(run, speeds, 0.25)


def test_a_compressed_run_is_predicted_from_the_workload_of_its_codec(tmp_path):
    """--compressed-workload: a run with --compress C is predicted from the 1-rank run of
    C (its t_codec rows hold the reducer's measured codec cost), every other run from
    --workload; a compressed workload that ran without --compress, or two of one codec,
    is one line."""
    import pytest

    from syncbench.bench.simulate.validate import compressed_workloads, workload_for

    def one(name, compress):
        phases = {"compute": 0.01, **({"codec": 0.002} if compress != "none" else {})}
        return write_file(tmp_path / name, algorithm="ssgd", world_size=1, wall=1.0,
                          steps_per_rank=6, config={"compress": compress}, phases=phases)

    plain, topk, psgd = one("p.h5", "none"), one("t.h5", "topk:0.01"), one("q.h5", "powersgd:2")
    args = argparse.Namespace(workload=plain, batch_size=None, sim_device=None,
                              device_flops=None, efficiency=None,
                              compressed_workload=[topk, psgd])
    from syncbench.bench.simulate.inputs import build_workload

    default = build_workload(args)
    by_codec = compressed_workloads(args, default)
    assert sorted(by_codec) == ["powersgd:2", "topk:0.01"]
    runs = {c: read_run(write_file(tmp_path / f"r{i}.h5", algorithm="ssgd", world_size=2,
                                   wall=2.0, steps_per_rank=4, config={"compress": c}))
            for i, c in enumerate(["topk:0.01", "int8", "none"])}
    chosen = workload_for(runs["topk:0.01"], default, by_codec)
    # --workload's step times, the codec run's t_codec
    assert chosen.rows is default.rows and chosen.extra["compress"] == "topk:0.01"
    assert chosen.mean_codec_s == by_codec["topk:0.01"].mean_codec_s
    assert chosen.extra["codec_source"] == topk and chosen.mean_codec_s > 0
    assert workload_for(runs["int8"], default, by_codec) is default
    assert workload_for(runs["none"], default, by_codec) is default
    for given, words in (([plain], "ran without --compress"),
                         ([topk, topk], "two runs of --compress topk:0.01")):
        with pytest.raises(ValueError, match=words):
            compressed_workloads(argparse.Namespace(**{**vars(args),
                                                       "compressed_workload": given}), default)


def test_a_compressed_run_pays_its_codec_runs_time_between_phases_beyond_the_workloads(
        tmp_path):
    """A compressed step does the reducer's own work outside its codec phase. The codec
    run spends 0.5 ms a step between its phases, the workload 0.1 ms: a compressed
    prediction pays 0.4 ms a step more with its codec (codec_cost), a quota slows it as
    it slows the codec. Before, only the workload's 0.1 ms was replayed, and PowerSGD on
    mlp (2 emulated nodes, 1 Gbit/s) was predicted 8-18% fast (docs/RESULTS.md)."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate.compressed import codec_cost
    from syncbench.bench.simulate.inputs import build_workload
    from syncbench.bench.simulate.validate import compressed_workloads, workload_for

    def one(name, compress, between):
        phases = {"compute": 0.01, **({"codec": 0.002} if compress != "none" else {})}
        rows = {0: make_rank(8, phases, step_time=sum(phases.values()) + between)}
        return write_file(tmp_path / name, algorithm="ssgd", world_size=1, wall=1.0,
                          steps_per_rank=8, config={"compress": compress}, phases=phases,
                          rank_rows=rows)

    plain, psgd = one("p.h5", "none", 1e-4), one("q.h5", "powersgd:2", 5e-4)
    args = argparse.Namespace(workload=plain, batch_size=None, sim_device=None,
                              device_flops=None, efficiency=None, compressed_workload=[psgd])
    default = build_workload(args)
    assert default.mean_between_s == pytest.approx(1e-4)
    by_codec = compressed_workloads(args, default)
    run = read_run(write_file(tmp_path / "r.h5", algorithm="ssgd", world_size=2, wall=2.0,
                              steps_per_rank=4, config={"compress": "powersgd:2"}))
    chosen = workload_for(run, default, by_codec)
    assert chosen.codec_between_s == pytest.approx(4e-4)
    cfg = build_parser("simulate").parse_args(["simulate", "--compress", "powersgd:2",
                                               "--comm", "blocking"])
    seconds, words = codec_cost(cfg, chosen)
    assert seconds == pytest.approx(0.002 + 4e-4)
    assert "0.400 ms of its time between phases" in words
    # a host twice as slow does the loop's work at half speed too
    assert chosen.scaled(2.0).codec_between_s == pytest.approx(8e-4)
    # a codec run that spent less time between phases than the workload adds nothing
    slower = dataclasses.replace(default, mean_between_s=1e-3)
    assert workload_for(run, slower, by_codec).codec_between_s == 0.0


def test_a_runs_recorded_quota_bursts_go_to_its_simulation(tmp_path):
    """The cluster's measured pattern of a node's quota (rank attributes
    node_throttle_on_s and _off_s) is simulated for the ranks at a quota; a file without
    it keeps the --node-throttle given, or none."""
    bursts = write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=2, wall=2.0,
                        steps_per_rank=4,
                        rank_extra={1: {"node_speed": 0.5, "node_throttle_on_s": 0.0033,
                                        "node_throttle_off_s": 0.0047}})
    older = write_file(tmp_path / "o.h5", algorithm="ssgd", world_size=2, wall=2.0,
                       steps_per_rank=4, rank_extra={1: {"node_speed": 0.5}})
    args = argparse.Namespace(slowdown=None, algorithm="ssgd", node_throttle=None)
    assert _job(args, read_run(bursts))[0].node_throttle == "-,3.3/4.7"
    assert _job(args, read_run(older))[0].node_throttle is None
    # with the first burst's spread (node_throttle_first_lo_s and _hi_s) where recorded
    spread = write_file(tmp_path / "s.h5", algorithm="ssgd", world_size=2, wall=2.0,
                        steps_per_rank=4,
                        rank_extra={1: {"node_speed": 0.5, "node_throttle_on_s": 0.0031,
                                        "node_throttle_off_s": 0.0049,
                                        "node_throttle_first_lo_s": 0.0022,
                                        "node_throttle_first_hi_s": 0.005}})
    assert _job(args, read_run(spread))[0].node_throttle == "-,3.1/4.9/2.2-5"
    # a workload measured at a quota: the recorded (absolute) pattern is not stacked on it
    halves = write_file(tmp_path / "h.h5", algorithm="ssgd", world_size=2, wall=2.0,
                        steps_per_rank=4,
                        rank_extra={0: {"node_speed": 0.5},
                                    1: {"node_speed": 0.25, "node_throttle_on_s": 0.001,
                                        "node_throttle_off_s": 0.003}})
    assert _job(args, read_run(halves))[0].node_throttle == "-,1/3"
    assert _job(args, read_run(halves), 0.5)[0].node_throttle is None
    args.node_throttle = "3/5"  # the flag, where given, over the run's record
    assert _job(args, read_run(older))[0].node_throttle == "3/5"
    assert _job(args, read_run(bursts))[0].node_throttle == "3/5"
    # and, as a recorded pattern is, set to --quota-workload's efficiency times the rank's
    # node speed (0.8 x 0.5: 3 ms on, 4.5 off), whatever share the pattern had
    from syncbench.bench.simulate.quota import Throttle, throttle_spec
    from syncbench.bench.simulate.validate import with_share

    args.quota_efficiency = 0.8
    want = throttle_spec([None, with_share(Throttle(0.003, 0.005), 0.4)])
    assert want == "-,3/4.5"
    assert _job(args, read_run(bursts))[0].node_throttle == want
    args.node_throttle = None
    assert _job(args, read_run(bursts))[0].node_throttle == "-,3.3/4.95"


def test_a_runs_recorded_link_bucket_goes_to_its_simulation(tmp_path):
    """The token bucket of the run's links (rank attribute link_burst_bytes, the smallest
    of its ranks') is simulated unless --link-burst names one."""
    shaped = write_file(tmp_path / "s.h5", algorithm="ssgd", world_size=2, wall=2.0,
                        steps_per_rank=4, rank_extra={0: {"link_burst_bytes": 262144.0},
                                                      1: {"link_burst_bytes": 52224.0}})
    args = argparse.Namespace(slowdown=None, algorithm="ssgd", link_burst=None)
    assert _job(args, read_run(shaped))[0].link_burst == 52224.0
    args.link_burst = "0"
    assert _job(args, read_run(shaped))[0].link_burst == "0"


def test_a_runs_host_speed_is_its_free_ranks_compute_over_the_workloads(tmp_path):
    """--validate-host-speed run: a run whose ranks at full speed computed 30 ms a step
    against a workload's 20 ms is predicted from the workload 1.5x slower; a slowed or
    throttled rank does not count, and the profile-less fallback is 1."""
    import numpy as np

    from syncbench.bench.simulate.validate import host_factor
    from syncbench.bench.simulate.workload import Workload

    run = write_file(tmp_path / "r.h5", algorithm="ssgd", world_size=2, wall=2.0,
                     steps_per_rank=8, phases={"compute": 0.03},
                     rank_extra={1: {"node_speed": 0.5}})
    rows = np.tile([0.001, 0.02, 0.002], (10, 1))
    w = Workload(name="mlp", params=10, batch_size=1, dataset_samples=10, rows=rows,
                 rank_bounds=[0, 10])
    assert host_factor(read_run(run), w) == pytest.approx(1.5)
    slower = w.scaled(1.5)
    assert slower.median_compute_s() == pytest.approx(0.03)
    np.testing.assert_allclose(slower.rows[:, 0], 0.0015)
    throttled = write_file(tmp_path / "t.h5", algorithm="ssgd", world_size=1, wall=2.0,
                           steps_per_rank=8, rank_extra={0: {"node_speed": 0.5}})
    assert host_factor(read_run(throttled), w) == 1.0


def test_each_ranks_host_speed_is_its_own_mean_compute_over_its_workload_ranks(tmp_path):
    """--validate-host-speed rank: in a homogeneous run rank 0 computed 30 ms a step and
    rank 1 20 ms, against a workload's two ranks at 24 and 16: factors 1.25 each, the
    rows of each measured rank scaled by its own; a slowed rank its own compute's; a
    throttled rank without its CPU time takes the free ranks' pooled factor (their
    steps' mean over the workload ranks' mean); a run of other ranks than the
    workload's falls back to the run's one factor; the row's note shows the two where
    they differ."""
    import numpy as np

    from syncbench.bench.simulate.validate import (
        host_speeds,
        rank_host_factors,
        row_note,
        scaled_for_host,
    )
    from syncbench.bench.simulate.workload import Workload

    ranks = {0: make_rank(8, {"compute": 0.03}), 1: make_rank(8, {"compute": 0.02})}
    run = read_run(write_file(tmp_path / "h.h5", algorithm="ssgd", world_size=2, wall=2.0,
                              steps_per_rank=8, rank_rows=ranks))
    rows = np.concatenate([np.tile([0.001, 0.024, 0.002], (10, 1)),
                           np.tile([0.001, 0.016, 0.002], (10, 1))])
    w = Workload(name="mlp", params=10, batch_size=1, dataset_samples=10, rows=rows,
                 rank_bounds=[0, 10, 20], mean_codec_s=0.001)
    assert rank_host_factors(run, w) == pytest.approx([1.25, 1.25])
    fast_first = read_run(write_file(tmp_path / "f.h5", algorithm="ssgd", world_size=2,
                                     wall=2.0, steps_per_rank=8,
                                     rank_rows={0: ranks[1], 1: ranks[0]}))
    factors = host_speeds("rank", fast_first, w)
    assert factors == pytest.approx((20 / 24, 30 / 16))
    scaled = scaled_for_host(w, factors, 2.0)
    assert scaled.rank_means() == pytest.approx([0.020, 0.030])  # each its measured one
    np.testing.assert_allclose(scaled.rows[:10, 0], 0.001 * 20 / 24)
    assert scaled.mean_codec_s == pytest.approx(0.002)
    assert w.rank_means() == pytest.approx([0.024, 0.016])  # the workload is untouched
    # the run's one factor, the median's, would give both ranks 25 / 20 = 1.25
    assert host_speeds("run", fast_first, w) == pytest.approx((1.25,))
    assert host_speeds("workload", fast_first, w) == (1.0,)
    throttled = read_run(write_file(tmp_path / "t.h5", algorithm="ssgd", world_size=2,
                                    wall=2.0, steps_per_rank=8,
                                    rank_rows={0: ranks[0],
                                               1: make_rank(8, {"compute": 0.08})},
                                    rank_extra={1: {"node_speed": 0.5}}))
    assert rank_host_factors(throttled, w) == pytest.approx([30 / 24, 30 / 20])
    # a throttled rank that measured its compute's CPU time (18 ms a step, the quota's
    # freezes not in it) takes its own factor, 18 / 16, not the free rank's CPU's
    timed = make_rank(8, {"compute": 0.08})
    timed["cpu_compute"] = np.full(8, 0.018)
    own = read_run(write_file(tmp_path / "c.h5", algorithm="ssgd", world_size=2, wall=2.0,
                              steps_per_rank=8, rank_rows={0: ranks[0], 1: timed},
                              rank_extra={1: {"node_speed": 0.5}}))
    assert rank_host_factors(own, w) == pytest.approx([30 / 24, 18 / 16])
    timed["cpu_compute"] = np.full(8, np.nan)  # not measured: the pooled factor again
    unmeasured = read_run(write_file(tmp_path / "n.h5", algorithm="ssgd", world_size=2,
                                     wall=2.0, steps_per_rank=8,
                                     rank_rows={0: ranks[0], 1: timed},
                                     rank_extra={1: {"node_speed": 0.5}}))
    assert rank_host_factors(unmeasured, w) == pytest.approx([30 / 24, 30 / 20])
    # every node at speed 0.5 and the workload measured at 0.5 too (the 4-node set): the
    # quota's freezes are in both walls, so each rank compares its compute's wall (30
    # and 80 ms), not its CPU time (18 ms), and "run" takes them as free ranks
    timed["cpu_compute"] = np.full(8, 0.018)
    halved = read_run(write_file(tmp_path / "q.h5", algorithm="ssgd", world_size=2,
                                 wall=2.0, steps_per_rank=8,
                                 rank_rows={0: ranks[0], 1: timed},
                                 rank_extra={0: {"node_speed": 0.5}, 1: {"node_speed": 0.5}}))
    at_quota = dataclasses.replace(w, extra={"node_speed": 0.5})
    assert rank_host_factors(halved, at_quota) == pytest.approx([30 / 24, 80 / 16])
    assert host_speeds("run", halved, at_quota) == pytest.approx((55 / 20,))
    # against a workload at full speed: rank 1 by its CPU time; rank 0, with none and no
    # rank free to pool, 1
    assert rank_host_factors(halved, w) == pytest.approx([1.0, 18 / 16])
    # a rank slowed 2x (--slowdown, its delay timed apart) that computed 14 ms a step: its
    # own factor, 14 / 16, not the free rank's CPU's 30 / 20 (its CPU ran faster)
    slowed = read_run(write_file(tmp_path / "s.h5", algorithm="ssgd", world_size=2,
                                 wall=2.0, steps_per_rank=8,
                                 rank_rows={0: ranks[0],
                                            1: make_rank(8, {"compute": 0.014,
                                                             "delay": 0.014})},
                                 rank_extra={1: {"slowdown": 2.0}}))
    assert rank_host_factors(slowed, w) == pytest.approx([30 / 24, 14 / 16])
    one = read_run(write_file(tmp_path / "o.h5", algorithm="ssgd", world_size=1, wall=2.0,
                              steps_per_rank=8, phases={"compute": 0.03}))
    assert rank_host_factors(one, w) is None
    assert host_speeds("rank", one, w) == pytest.approx((1.5,))  # the run's: 30 / 20
    with pytest.raises(ValueError, match="1 factor"):
        w.scaled_ranks([1.0], 1.0)
    assert row_note(fast_first, "mlp", (0.8, 1.9))[0] == "  host x0.80/1.90"
    assert row_note(fast_first, "mlp", (1.1, 1.1))[0] == "  host x1.10"


def test_a_runs_codec_takes_the_hosts_speed_from_its_own_codec_time(tmp_path):
    """--validate-host-speed run: the free rank's codec took 1.2 ms a step where the codec
    workload took 0.4 (a factor 3) while its compute took 1.5 times the workload's: the
    codec's cost is scaled by 3, the compute by 1.5; a run without a codec time, or a
    workload without a codec cost, keeps the compute's factor."""
    import numpy as np

    from syncbench.bench.simulate.validate import codec_factor
    from syncbench.bench.simulate.workload import Workload

    ranks = {0: make_rank(8, {"compute": 0.03, "codec": 0.0012}),
             1: make_rank(8, {"compute": 0.06, "codec": 0.0024})}
    run = read_run(write_file(tmp_path / "c.h5", algorithm="ssgd", world_size=2, wall=2.0,
                              steps_per_rank=8, rank_rows=ranks,
                              rank_extra={1: {"node_speed": 0.5}}))
    rows = np.tile([0.001, 0.02, 0.002], (10, 1))
    w = Workload(name="mlp", params=10, batch_size=1, dataset_samples=10, rows=rows,
                 rank_bounds=[0, 10], mean_codec_s=0.0004)
    assert codec_factor(run, w, 1.5) == pytest.approx(3.0)
    scaled = w.scaled(1.5, 3.0)
    assert scaled.mean_codec_s == pytest.approx(0.0012)
    assert scaled.median_compute_s() == pytest.approx(0.03)
    plain = read_run(write_file(tmp_path / "p.h5", algorithm="ssgd", world_size=1, wall=2.0,
                                steps_per_rank=8, phases={"compute": 0.03}))
    assert codec_factor(plain, w, 1.5) == 1.5
    assert codec_factor(run, Workload(name="mlp", params=10, batch_size=1,
                                      dataset_samples=10, rows=rows, rank_bounds=[0, 10]),
                        1.5) == 1.5


def test_the_other_column_holds_a_steps_time_between_its_phases(tmp_path):
    """--validate's "other ms": data, update and codec, and the time between a step's
    phases (a simulated rank replays it with its data): 1 ms of data and 2 ms between
    phases read 3 ms; the throughput is the rows' span's."""
    from syncbench.bench.simulate.validate import row_figures

    ranks = {r: make_rank(8, {"data": 0.001, "compute": 0.02}, step_time=0.023)
             for r in (0, 1)}
    figures = row_figures(ranks)
    assert figures["other_ms"] == pytest.approx(3.0)
    assert figures["compute_ms"] == pytest.approx(20.0)
    assert figures["samples_per_s"] == pytest.approx(2 * 8 * 64 / (7 * 0.023 + 0.021))


def test_a_quota_workload_gives_the_quotas_efficiency_on_the_model(tmp_path):
    """--quota-workload: rank 1 at speed 0.5 computed 50 ms a step against rank 0's 20 ms
    (a share of 0.4): an efficiency of 0.8 against its speed, whatever share its node's
    probe pattern gave (3/5 ms: 0.375); a throttled rank is then simulated at 0.8 of its
    speed, its pattern's running span kept (frozen 4.5 ms, not 5)."""
    import numpy as np

    from syncbench.bench.simulate.quota import Throttle
    from syncbench.bench.simulate.validate import quota_efficiency, with_share

    ranks = {0: make_rank(8, {"compute": 0.02, "comm": 0.03}),
             1: make_rank(8, {"compute": 0.05})}
    pattern = {"node_speed": 0.5, "node_throttle_on_s": 0.003, "node_throttle_off_s": 0.005}
    path = write_file(tmp_path / "q.h5", algorithm="localsgd", world_size=2, wall=2.0,
                      steps_per_rank=8, rank_rows=ranks, rank_extra={1: pattern})
    assert quota_efficiency([path], "mlp") == pytest.approx(0.8)
    # several runs (the quota set anew for each: what a rank realises of it moves from one
    # setting to the next): the mean of their efficiencies; a run whose node's probe was
    # preempted in every try (its pattern NaN) counts as well
    other = {0: make_rank(8, {"compute": 0.02}), 1: make_rank(8, {"compute": 0.04})}
    again = write_file(tmp_path / "q2.h5", algorithm="localsgd", world_size=2, wall=2.0,
                       steps_per_rank=8, rank_rows=other,
                       rank_extra={1: {"node_speed": 0.5,
                                       "node_throttle_on_s": float("nan"),
                                       "node_throttle_off_s": float("nan")}})
    assert quota_efficiency([path, again], "mlp") == pytest.approx(0.9)
    # a run whose throttled rank talked is refused
    talked = write_file(tmp_path / "t.h5", algorithm="ssgd", world_size=2, wall=2.0,
                        steps_per_rank=8,
                        rank_rows={0: make_rank(8, {"compute": 0.02}),
                                   1: make_rank(8, {"compute": 0.05, "comm": 0.03})},
                        rank_extra={1: pattern})
    with pytest.raises(ValueError, match="give a run with a rank at a quota"):
        quota_efficiency([path, talked], "mlp")
    # a throttled rank that measured its compute's CPU time: its work a step is its own 22
    # ms of CPU plus the free rank's 3 ms of data and update and 4 ms between its phases
    # (the loop's own work), in a step of 60 ms (10 ms of it outside its phases): 29 / 60
    # over its speed, not the free rank's 20 ms over its 50 ms of compute (0.8) nor its
    # own 22 over 50 (0.88), nor 25 / 60 (the free rank's loop left out)
    timed = make_rank(8, {"compute": 0.05}, step_time=0.06)
    timed["cpu_compute"] = np.full(8, 0.022)
    own = write_file(tmp_path / "c.h5", algorithm="localsgd", world_size=2, wall=2.0,
                     steps_per_rank=8,
                     rank_rows={0: make_rank(8, {"data": 0.001, "compute": 0.02,
                                                 "update": 0.002}, step_time=0.027),
                                1: timed},
                     rank_extra={1: pattern})
    assert quota_efficiency([own], "mlp") == pytest.approx(29 / 60 / 0.5)
    scaled = with_share(Throttle(0.003, 0.005, 0.002, 0.005), 0.4)
    assert scaled.share == pytest.approx(0.4)
    assert (scaled.on_s, scaled.first_lo_s, scaled.first_hi_s) == (0.003, 0.002, 0.005)
    assert scaled.off_s == pytest.approx(0.0045)
    with pytest.raises(ValueError, match="model mlp, but --workload ran lenet"):
        quota_efficiency([path], "lenet")
    # a throttled rank that waited in MPI, or no rank at a quota: one line
    talking = {0: make_rank(8, {"compute": 0.02}), 1: make_rank(8, {"compute": 0.05,
                                                                    "comm": 0.03})}
    busy = write_file(tmp_path / "b.h5", algorithm="ssgd", world_size=2, wall=2.0,
                      steps_per_rank=8, rank_rows=talking,
                      rank_extra={1: {"node_speed": 0.5, "node_throttle_on_s": 0.003,
                                      "node_throttle_off_s": 0.003}})
    hom = write_file(tmp_path / "h.h5", algorithm="localsgd", world_size=2, wall=2.0,
                     steps_per_rank=8)
    for bad in (busy, hom):
        with pytest.raises(ValueError, match="give a run with a rank at a quota"):
            quota_efficiency([bad], "mlp")
    with pytest.raises(ValueError, match="--quota-workload"):
        quota_efficiency([str(tmp_path / "missing.h5")], "mlp")


def test_a_configurations_error_is_the_geometric_mean_of_its_repeats():
    """Two repeats +20% and -20%: the configuration's error is sqrt(1.2 x 0.8) - 1, about
    -2%, not off; a repeat predicted at 0 samples/s (-100%) or NaN leaves its
    configuration without an error, counted as off, and the table still prints."""
    import math

    from syncbench.bench.simulate.validate import config_errors, config_table

    cells = [("ssgd", "hom", 0.2), ("ssgd", "hom", -0.2), ("asgd", "hom", 0.3),
             ("asgd", "work 2x", -1.0), ("asgd", "quota 0.5", math.nan)]
    errors = config_errors(cells)
    assert errors[("ssgd", "hom")] == pytest.approx(math.sqrt(1.2 * 0.8) - 1)
    assert errors[("asgd", "hom")] == pytest.approx(0.3)
    assert math.isnan(errors[("asgd", "work 2x")]) and math.isnan(errors[("asgd", "quota 0.5")])
    table = config_table(cells)
    assert "* off by more than 15%: 3 of 4 configurations" in table
    assert "1-2 repeat(s)" in table
    assert "mean |error| 16.0%" in table


def test_the_repeats_spread_says_how_many_configurations_noise_alone_leaves_off():
    """Two homogeneous configurations whose repeats' logs differ by 0.2 each: the pooled
    run sd is sqrt((0.02 + 0.02) / 2) = 0.1414, a 2-repeat configuration's 0.1, so an
    unbiased model leaves each off by more than 15% with probability
    P(z > log(1.15) / 0.1) + P(z < log(0.85) / 0.1) = 0.1332; the second configuration
    (mean log 0.2, +22%) is off. A column whose configurations have one repeat each has
    no spread; a NaN repeat is left out of the spread and its configuration counted off."""
    import math

    from syncbench.bench.simulate.validate import config_table, repeat_spread

    cells = [("ssgd", "hom", math.expm1(0.1)), ("ssgd", "hom", math.expm1(-0.1)),
             ("asgd", "hom", math.expm1(0.3)), ("asgd", "hom", math.expm1(0.1)),
             ("ssgd", "work 2x", 0.05), ("asgd", "work 2x", 0.4),
             ("ssgd", "quota 0.5", 0.0), ("ssgd", "quota 0.5", math.nan),
             ("asgd", "quota 0.5", 0.1), ("asgd", "quota 0.5", -0.1)]
    rows = {r.config: r for r in repeat_spread(cells)}
    assert set(rows) == {"hom", "quota 0.5"}
    hom = rows["hom"]
    assert hom.run_sd == pytest.approx(math.sqrt(0.02))
    assert (hom.configurations, hom.freedom, hom.off) == (2, 2, 1)
    tail = 0.5 * math.erfc(math.log(1.15) / 0.1 / math.sqrt(2)) \
        + 0.5 * math.erfc(-math.log(0.85) / 0.1 / math.sqrt(2))
    assert tail == pytest.approx(0.1332, abs=1e-4)
    assert hom.chance_off == pytest.approx(2 * tail)
    quota = rows["quota 0.5"]
    assert (quota.freedom, quota.off) == (1, 1)  # the NaN repeat: no pair, counted off
    assert quota.run_sd == pytest.approx(abs(math.log(1.1) - math.log(0.9)) / math.sqrt(2))
    table = config_table(cells)
    assert hom.chance(2) == pytest.approx(tail)
    # 1 in 20: 3 repeats give sd 0.0816 (a chance of 0.067), 4 give 0.0707 (0.035)
    assert hom.chance(3) > 0.05 >= hom.chance(4) and hom.repeats_for() == 4
    assert ("  hom            a run 14.1% (2 degrees of freedom); off 1 of 2, by chance 0.3; "
            "1 in 20 with 4 repeat(s)") in table
    assert "work 2x" not in table.split("repeats' spread")[1]


def test_a_run_other_processes_loaded_is_named_under_the_table():
    """A run whose host other processes used above a tenth of the cores (the run file's
    ``foreign_cpu_share``) is marked in its row and counted under the table: its error
    is not the model's alone (the quota runs of one validation set: 117 of 144 at 0.2)."""
    from types import SimpleNamespace

    from syncbench.bench.simulate.validate import loaded_line, row_note

    quiet = SimpleNamespace(model="mlp", attrs={"foreign_cpu_share": 0.03})
    busy = SimpleNamespace(model="mlp", attrs={"foreign_cpu_share": 0.21})
    unknown = SimpleNamespace(model="lenet", attrs={})
    assert row_note(quiet, "mlp", 1.0) == ("", None)
    at_line = SimpleNamespace(model="mlp", attrs={"foreign_cpu_share": 0.10})
    assert row_note(at_line, "mlp", 1.0) == ("", None)  # above a tenth, not at it
    assert row_note(busy, "mlp", 1.26) == ("  host x1.26  loaded 21%", 0.21)
    assert row_note(unknown, "mlp", 1.0) == ("  (model lenet != workload)", None)
    assert loaded_line([0.21, 0.25], 12).startswith(
        "loaded: 2 of 12 runs were measured while other processes used more than 10% of "
        "the host's cores (up to 25%")


def test_a_workloads_ranks_are_replayed_at_their_common_mean(capsys):
    """--validate-workload-ranks pooled (the default): a workload whose two unslowed ranks
    computed 24 and 20 ms a step is replayed with both at 22 ms, each rank's own steps in
    their order (the rises and falls kept); ``each`` keeps every rank's own speed, and a
    workload with a slowed rank (a measured delay) is left as it was measured."""
    import numpy as np

    from syncbench.bench.simulate.validate import pooled_workload
    from syncbench.bench.simulate.workload import Workload

    wiggle = np.array([0.9, 1.1, 1.0, 1.0])
    rows = np.concatenate([np.outer(0.024 * wiggle, [0.05, 1.0, 0.1]),
                           np.outer(0.020 * wiggle[::-1], [0.05, 1.0, 0.1])])
    w = Workload(name="lenet", params=10, batch_size=1, dataset_samples=10, rows=rows,
                 rank_bounds=[0, 4, 8], delay_ratio=np.zeros(8))
    pooled = pooled_workload(argparse.Namespace(validate_workload_ranks="pooled"), w)
    assert pooled.rank_means() == pytest.approx([0.022, 0.022])
    np.testing.assert_allclose(pooled.rows[:4, 1], 0.022 * wiggle)
    np.testing.assert_allclose(pooled.rows[4:, 1], 0.022 * wiggle[::-1])
    np.testing.assert_allclose(pooled.rows[:, 0] / pooled.rows[:, 1], 0.05)
    assert w.rank_means() == pytest.approx([0.024, 0.020])  # the measured one is untouched
    line = capsys.readouterr().out
    assert "24.000, 20.000 ms: replayed at their mean, 22.000 ms" in line
    kept = pooled_workload(argparse.Namespace(validate_workload_ranks="each"), w)
    assert kept is w and not capsys.readouterr().out
    slowed = Workload(name="lenet", params=10, batch_size=1, dataset_samples=10, rows=rows,
                      rank_bounds=[0, 4, 8], delay_ratio=np.r_[np.zeros(4), np.ones(4)])
    assert slowed.pooled() is slowed
    throttled = Workload(name="lenet", params=10, batch_size=1, dataset_samples=10,
                         rows=rows, rank_bounds=[0, 4, 8], delay_ratio=np.zeros(8),
                         extra={"rank_node_speeds": [1.0, 0.5]})
    assert throttled.pooled() is throttled
    uneven = Workload(name="lenet", params=10, batch_size=1, dataset_samples=10,
                      rows=rows[:6], rank_bounds=[0, 4, 6], delay_ratio=np.zeros(6))
    # the ranks' means weigh alike, whatever their rows: 22 ms is (24 + 20) / 2
    assert uneven.pooled().rank_means() == pytest.approx([0.022, 0.022])


def test_a_validate_out_folder_that_cannot_be_made_is_one_error():
    """/proc takes no folder, though root's access() may pass it: a ValueError naming the
    flag (one line from the command), not the OSError's traceback."""
    from syncbench.bench.simulate.validate import predicted_path

    with pytest.raises(ValueError, match="--validate-out /proc/syncbench-nope"):
        predicted_path("/proc/syncbench-nope", "run.h5", False)


def test_a_runs_free_ranks_waits_give_the_share_of_a_wait_its_quota_charges(tmp_path):
    """--validate simulates a throttled rank's waits on the CPU as much as the run's free
    ranks were: their cpu_sync over t_comm + t_wait (here 3.6 of 4 ms: 0.9; the throttled
    rank's own 0.5 of 4 ms, frozen through most of its wait, is not the library's way of
    waiting); a file from before the column takes --node-wait-cpu's default, and the flag,
    where given, replaces the record."""
    import numpy as np

    from syncbench.bench.simulate.validate import wait_cpu_share

    phases = {"compute": 0.005, "comm": 0.001, "wait": 0.003}
    rows = {0: make_rank(8, phases), 1: make_rank(8, phases)}
    rows[0]["cpu_sync"] = np.full(8, 0.0036)
    rows[1]["cpu_sync"] = np.full(8, 0.0005)
    extra = {1: {"node_speed": 0.5, "node_throttle_on_s": 0.003, "node_throttle_off_s": 0.005}}
    run = read_run(write_file(tmp_path / "w.h5", algorithm="ssgd", world_size=2, wall=2.0,
                              steps_per_rank=8, rank_rows=rows, rank_extra=extra))
    assert wait_cpu_share(run) == pytest.approx(0.9)
    args = argparse.Namespace(slowdown=None, algorithm="ssgd", node_throttle=None,
                              node_wait_cpu=None)
    assert _job(args, run)[0].node_wait_cpu == pytest.approx(0.9)
    older = read_run(write_file(tmp_path / "o.h5", algorithm="ssgd", world_size=2, wall=2.0,
                                steps_per_rank=8, rank_extra=extra))
    assert wait_cpu_share(older) is None
    assert _job(args, older)[0].node_wait_cpu is None  # the simulation's default, 1
    args.node_wait_cpu = "0.3"
    assert _job(args, run)[0].node_wait_cpu == "0.3"
