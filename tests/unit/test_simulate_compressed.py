"""SSGD's compressing reducers and the DiLoCo family, simulated (``bench/simulate/compressed.py``,
``bench/simulate/rounds.py``): the bytes are the reducers' own, PowerSGD's two Allreduces
follow each other, DiLoCo with H 1 is blocking SSGD, Streaming DiLoCo posts on
``StreamingAverager``'s steps. Phase durations are given (no SimGrid) but for the
command-line check.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from syncbench.algorithms.averagers.streaming import fragment_offsets
from syncbench.algorithms.reducers.compress import compressed_reducer
from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import compressed, rounds, strategies
from syncbench.bench.simulate.collectives import Phase
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import Stragglers, build_zoo_model, from_profile

SPECS = ("fp16", "bf16", "int8", "int8:1000", "powersgd:2", "topk:0.01", "randomk:0.05")


def config(*flags: str):
    """``syncbench simulate``'s namespace: its defaults and ``flags``."""
    return build_parser("simulate").parse_args(["simulate", *flags])


def run(flags, n: int = 8, steps: int = 4, clock=None, seed: int = 0):
    cfg = config(*flags)
    local = LocalTimes(from_profile("mlp"), n, [1.0] * n, Stragglers(), seed)
    return strategies.simulator_for(cfg.algorithm)(cfg, local, steps,
                                                   clock or (lambda phase: 1e-4))


def real_reducer(spec: str, n: int, plan=None):
    """The reducer ``train`` builds for ``spec`` on mlp (a world of ``n`` ranks: the byte
    counts read only its size)."""
    core = SimpleNamespace(model=build_zoo_model("mlp", "fashion-mnist"),
                           comm=SimpleNamespace(size=n))
    return compressed_reducer(core, spec, plan, powersgd_start=0)


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("spec", SPECS)
def test_simulated_bytes_per_step_are_the_reducers_own(spec, n):
    timeline = run(["--compress", spec, "--comm", "blocking", "--powersgd-start", "0"], n=n,
                   steps=1)
    reducer = real_reducer(spec, n)
    assert timeline.notes["wire_bytes_per_step"] == reducer.wire_bytes()
    # the flows carry those bytes: each codec's first send buffer (PowerSGD: both)
    shell = compressed.reducer_for(spec, n, reducer.count, None, timeline_shapes(), 0)
    chain = compressed.collectives(shell, 0, n)
    kind, size = chain[0]
    sent = {"alltoallv": lambda: sum(size), "allgather": lambda: size[0],
            "allreduce": lambda: sum(s for _, s in chain)}[kind]()
    assert sent == reducer.wire_bytes()


def test_simulated_powersgd_declares_its_plain_steps_bytes_as_train_does():
    """--powersgd-start 3 over 5 simulated steps: 3 plain Allreduces of the gradient and 2
    compressed steps, the mean declared (``PowerSGDReduce.run_wire_bytes``)."""
    timeline = run(["--compress", "powersgd:2", "--comm", "blocking", "--powersgd-start", "3"],
                   n=4, steps=5)
    reducer = real_reducer("powersgd:2", 4)
    plain = 4 * reducer.count
    assert timeline.notes["wire_bytes_per_step"] == round(
        (3 * plain + 2 * reducer.wire_bytes()) / 5)


def timeline_shapes():
    return from_profile("mlp").tensor_shapes


@pytest.mark.parametrize("spec", ["topk:0.01", "randomk:0.05"])
def test_overlap_buckets_and_bytes_are_the_bucketed_reducers(spec):
    """Under --comm overlap the buckets are SSGD's plan and the bytes those of the reducer
    ``train`` builds on that plan (the sparsifiers post on one communicator: no MPI)."""
    w = from_profile("mlp")
    plan = strategies.bucket_plan(w, "auto")
    timeline = run(["--compress", spec], n=4, steps=2)
    assert timeline.notes["buckets"] == len(plan) > 1
    assert timeline.notes["wire_bytes_per_step"] == real_reducer(spec, 4, plan).wire_bytes()


def test_powersgd_allreduces_p_then_q_one_after_the_other():
    """Every phase takes L: a compressed step's comm is the stages of BOTH Allreduces
    (P's, then Q's), at least 2 L, not the longer one alone."""
    latency = 1e-3
    n = 16
    timeline = run(["--compress", "powersgd:2", "--comm", "blocking", "--powersgd-start", "0"],
                   n=n, steps=3, clock=lambda phase: latency)
    shell = compressed.reducer_for("powersgd:2", n, from_profile("mlp").params, None,
                                   timeline_shapes(), 0)
    p_stages, q_stages = (compressed.chain_stages([c], n, "auto", lambda phase: latency)
                          for c in compressed.collectives(shell, 0, n))
    rows = timeline.rows.arrays()
    comm = np.min([rows[k]["t_comm"] for k in rows], axis=0)  # the last rank to arrive's
    expected = latency * (len(p_stages) + len(q_stages))
    assert np.allclose(comm, expected) and expected >= 2 * latency
    assert len(p_stages) >= 1 and len(q_stages) >= 1


def test_powersgd_plain_steps_before_start_are_one_allreduce_of_the_gradient():
    """Bytes-only phases: the two plain steps move the whole gradient, the compressed
    third far less (mlp at rank 2: about 1/40 of it)."""
    timeline = run(["--compress", "powersgd:2", "--comm", "blocking", "--powersgd-start", "2"],
                   n=16, steps=3, clock=lambda phase: phase.nbytes * 1e-9)
    rows = timeline.rows.arrays()
    comm = np.min([rows[k]["t_comm"] for k in rows], axis=0)
    assert comm[0] == pytest.approx(comm[1]) and comm[2] < comm[0] / 10


def test_alltoallv_blocks_of_32_peers_each_send_a_segment():
    """MPICH's blocked Ialltoallv on 70 ranks: blocks of 32, 32 and 6 shifts (shift 0 is
    the rank itself); above 64 ranks each block is timed by sampled shifts."""
    seen: list[Phase] = []
    stages = compressed.alltoallv_stages(70, [10] * 70, lambda p: seen.append(p) or 1.0)
    assert len(stages) == 3
    assert {p.nbytes for p in seen} == {310.0, 320.0, 60.0}  # 31, 32, 6 peers x 10 bytes
    small = compressed._BlockPhase("alltoall-block", 0, 8, 5.0)
    assert sorted(small.pairs()) == sorted((i, (i + s) % 8) for i in range(8)
                                           for s in range(1, 8))


def test_allgather_follows_mpichs_choice():
    assert [p.pattern for p in compressed.allgather_phases(8, [100] * 8)] == ["xor"] * 3
    assert [p.repeat for p in compressed.allgather_phases(8, [100_000] * 8)] == [7]
    bruck = compressed.allgather_phases(6, [100] * 6)
    assert [(p.arg, p.nbytes) for p in bruck] == [(5, 100), (4, 200), (2, 200)]


def test_diloco_with_one_inner_step_is_blocking_ssgd():
    clock = lambda phase: 1e-3 + phase.nbytes / 12.5e9  # noqa: E731
    ssgd = run(["--algorithm", "ssgd", "--comm", "blocking", "--stragglers",
                "lognormal:0.5"], n=8, steps=10, clock=clock, seed=3)
    diloco = run(["--algorithm", "diloco", "--inner-steps", "1", "--stragglers",
                  "lognormal:0.5"], n=8, steps=10, clock=clock, seed=3)
    assert diloco.wall_s == pytest.approx(ssgd.wall_s, rel=1e-9)


def test_diloco_warmup_steps_are_ssgds_and_rounds_end_with_the_outer_allreduce():
    timeline = run(["--algorithm", "diloco", "--inner-steps", "4", "--sync-warmup", "2"],
                   n=8, steps=10, clock=lambda phase: 1e-3)
    comm = timeline.rows.arrays()[0]["t_comm"]
    assert (comm[:2] > 0).all()  # warm-up: the gradient's Allreduce every step
    assert [j for j in range(2, 10) if comm[j] > 0] == [5, 9]  # rounds of 4, then of 4
    assert timeline.notes["warmup_steps"] == 2


def test_streaming_fragments_post_and_wait_on_the_averagers_steps():
    """H 8, P 2, tau 2: torchft's offsets 4 and 8; fragment 0 posts after inner steps 4,
    12, 20, fragment 1 after 8, 16; each is waited for tau steps later, and the last
    step completes fragment 0's post of step 20. The network is slow (every phase 1 s
    against a step of about 1 ms), so every wait is seen."""
    steps, period = 20, 8
    timeline = run(["--algorithm", "diloco", "--inner-steps", str(period), "--fragments", "2",
                    "--overlap-steps", "2"], n=4, steps=steps, clock=lambda phase: 1.0)
    offsets = fragment_offsets(period, 2)
    expected = {str(p): [s for s in range(1, steps + 1) if s >= o and (s - o) % period == 0]
                for p, o in enumerate(offsets)}
    assert timeline.notes["fragment_posts"] == expected == {"0": [4, 12, 20], "1": [8, 16]}
    wait = timeline.rows.arrays()[0]["t_wait"]
    assert [j + 1 for j in range(steps) if wait[j] > 0] == [6, 10, 14, 18, 20]


def test_streaming_without_overlap_waits_at_the_post():
    timeline = run(["--algorithm", "diloco", "--inner-steps", "4", "--fragments", "2"],
                   n=4, steps=8, clock=lambda phase: 1.0)
    wait = timeline.rows.arrays()[0]["t_wait"]
    assert [j + 1 for j in range(8) if wait[j] > 0] == [2, 4, 6, 8]


@pytest.mark.parametrize("spec", ["int8", "int4", "fp16"])
def test_streaming_quantized_fragments_travel_as_the_codecs_reducer_sends_them(spec):
    """``--quantize CODEC``: a fragment's stages are its codec reducer's all-to-all and
    allgather of codes (``QuantizedReduction``), their bytes the reducer's own per
    fragment, not a float32 Iallreduce of the fragment."""
    n, flags = 4, ["--algorithm", "diloco", "--inner-steps", "8", "--fragments", "2",
                   "--overlap-steps", "1"]
    sizes: list[float] = []

    def clock(phase):
        sizes.append(phase.nbytes * getattr(phase, "repeat", 1))
        return 1e-3 + phase.nbytes / 25e6

    cfg = config(*flags, "--quantize", spec)
    w = from_profile("mlp")
    bounds = rounds.fragment_bounds(w.offsets(), w.params, 2)
    quantized = rounds.fragment_stages(cfg, n, w.params, w.itemsize, bounds, clock)
    plain = rounds.fragment_stages(config(*flags), n, w.params, w.itemsize, bounds, clock)
    reducer = compressed.reducer_for(spec, n, w.params, bounds)
    for p, (lo, hi) in enumerate(bounds):
        chain = compressed.collectives(reducer, p, n)
        assert [kind for kind, _ in chain] == ["alltoallv", "allgatherv"]
        # the codes all-to-all: the reducer's own bytes, the codec's for the fragment
        assert sum(chain[0][1]) == reducer.bucket_wire_bytes(p) >= reducer.codec.wire_bytes(
            hi - lo)
        assert quantized[p].sum() < plain[p].sum()  # fewer bytes than float32
    slow = run(flags, n=n, steps=16, clock=clock)
    fast = run([*flags, "--quantize", spec], n=n, steps=16, clock=clock)
    assert fast.wall_s < slow.wall_s


def test_slowmo_and_diloco_are_their_own_patterns():
    assert strategies.pattern_of("slowmo") == "slowmo"
    assert strategies.pattern_of("diloco") == "diloco"
    assert strategies.SIMULATORS["diloco"] is rounds.diloco


def test_bad_codec_spec_raises_one_line():
    with pytest.raises(ValueError, match="topk needs a density"):
        run(["--compress", "topk"], steps=1)
    with pytest.raises(ValueError, match="add --comm blocking"):
        run(["--compress", "powersgd:2"], steps=1)
    with pytest.raises(ValueError, match="--codec-seconds must be >= 0"):
        run(["--compress", "fp16", "--codec-seconds", "-1"], steps=1)


def test_codec_cost_is_in_rows_measured_with_the_same_codec_else_the_option():
    w = from_profile("mlp")
    assert compressed.codec_cost(config("--compress", "fp16", "--codec-seconds", "0.002"),
                                 w)[0] == 0.002
    w.rows, w.extra["compress"] = np.zeros((4, 3)), "fp16"
    seconds, where = compressed.codec_cost(config("--compress", "fp16",
                                                  "--codec-seconds", "0.002"), w)
    # a file written before t_codec: its update rows hold the codec
    assert seconds == 0.0 and "measured update rows" in where
    w.mean_codec_s = 0.003  # one with t_codec: its own mean
    seconds, where = compressed.codec_cost(config("--compress", "fp16",
                                                  "--codec-seconds", "0.002"), w)
    assert seconds == 0.003 and "mean t_codec" in where
    assert compressed.codec_cost(config("--compress", "int8", "--codec-seconds", "0.002"),
                                 w)[0] == 0.002
    timeline = run(["--compress", "fp16", "--comm", "blocking", "--codec-seconds", "0.01"],
                   n=4, steps=2)
    rows = timeline.rows.arrays()[0]
    plain = run(["--compress", "fp16", "--comm", "blocking"], n=4, steps=2).rows.arrays()[0]
    # the codec's own phase: update is what it is without one
    assert np.all(rows["t_codec"] == 0.01) and np.all(plain["t_codec"] == 0.0)
    assert np.array_equal(rows["t_update"], plain["t_update"])


def test_codec_seconds_auto_times_the_codec_on_the_workloads_gradient_here():
    """auto (--validate's default) charges one encode and decode timed on this host; a
    value neither a number nor auto is one line."""
    w = from_profile("mlp")
    seconds, where = compressed.codec_cost(config("--compress", "int8",
                                                  "--codec-seconds", "auto"), w)
    assert seconds > 0 and "timed on this host" in where and str(w.params) in where
    with pytest.raises(ValueError, match="a number of seconds or auto"):
        compressed.codec_cost(config("--compress", "int8", "--codec-seconds", "soon"), w)


def test_top_k_pays_every_ranks_row_of_its_decode_and_the_others_do_not():
    """A measured codec cost of m ranks covers m rows of top-k's decode (each rank's k
    entries added into the dense mean); n ranks pay n - m rows more, timed here. fp16's
    and PowerSGD's work per rank does not grow with N."""
    w = from_profile("mlp")
    w.rows, w.mean_codec_s = np.zeros((4, 3)), 0.003
    w.extra.update(compress="topk:0.01", codec_world_size=1)
    cfg = config("--compress", "topk:0.01")
    reducer = compressed.reducer_for("topk:0.01", 64, w.params, None, [], 0)
    seconds, where = compressed.codec_cost(cfg, w, reducer, 64)
    row = compressed.topk_row_seconds(reducer.codec.k(w.params), w.params)
    assert row > 0 and seconds == pytest.approx(0.003 + 63 * row)
    assert "63 more ranks' top-k rows" in where
    assert compressed.codec_cost(cfg, w, reducer, 1)[0] == 0.003
    w.extra.update(compress="fp16")
    fp16 = compressed.reducer_for("fp16", 64, w.params, None, [], 0)
    assert compressed.codec_cost(config("--compress", "fp16"), w, fp16, 64)[0] == 0.003
