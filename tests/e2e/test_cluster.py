"""Every multi-node path on the emulated cluster (``syncbench cluster``, as root).

The module brings up its own 2-node cluster (prefix ``tc``, subnet 10.83.0; 1 Gbit/s
links; node 2's monotonic clock 1000 s ahead; its nodes in Slurm when the local Slurm
cluster answers) and takes it down at the end. It checks, under MPICH and Open MPI,
every registered strategy on 2 nodes x 1 rank (accuracy, the run file's nodes, the
transports, the clock offsets, the bytes that crossed the links), the clock alignment of
a synchronous run, a 2-node Slurm job, and the cluster's own one-line errors.

Without root (or without ``unshare --time``) the tests skip, unless
``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cluster_helpers import REPO, TestCluster, launchers

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.analysis.runfile import read_run
from syncbench.bench.cluster import launch, state
from syncbench.bench.experiment.on_cluster import speed_setter
from syncbench.kernels.zoo import build_model

pytestmark = pytest.mark.cluster

TC = TestCluster("tc", "10.83.0")
NODES = TC.nodes
OFFSET_S = 1000
#: Flags that make each strategy do its characteristic thing within half an epoch.
QUICK = {"odsgd": ["--warmup-steps", "20"], "localsgd": ["--period", "4"],
         "oscars": ["--period", "4"]}
#: Fashion-MNIST after half an epoch: every strategy is far above chance (0.1).
MIN_ACCURACY = 0.6


def _slurm_answers() -> bool:
    return shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0


@pytest.fixture(scope="module")
def cluster():
    slurm = TestCluster.why_not() is None and _slurm_answers()
    with TC.up("--link", "1gbit", "--clock-offset", f"0,{OFFSET_S}",
               *(["--slurm"] if slurm else []), time_namespaces=True) as state:
        yield {"slurm": slurm, "state": state}


def _check_nodes_and_clocks(run) -> None:
    assert list(run.attrs["hostnames"]) == NODES
    assert int(run.attrs["nodes"]) == 2
    assert [run.rank_attrs[r]["hostname"] for r in (0, 1)] == NODES
    offset = float(run.rank_attrs[1]["clock_offset_s"])
    error = float(run.rank_attrs[1]["clock_uncertainty_s"])
    assert abs(offset - OFFSET_S) < 1e-4 and error < 1e-4, (offset, error)


#: The strategies that also run under Open MPI across the nodes: one per kind of MPI
#: call (SSGD's Allreduce, ASGD's RMA windows, D-PSGD's neighbourhood collectives,
#: OD-SGD's Iallreduce across steps). Every strategy runs under MPICH.
OPEN_MPI_STRATEGIES = ("asgd", "dpsgd", "odsgd", "ssgd")
#: Those of make test (the others are marked slow: make test-all).
FAST = {"mpich": {"asgd", "dpsgd", "ssgd"}, "openmpi": {"asgd"}}


def _strategy_launchers() -> list:
    """(name, python, env, transport): every strategy with MPICH, some with Open MPI."""
    mpich, ompi = launchers(with_transport=True)
    return [pytest.param(name, *launcher.values, id=f"{launcher.id}-{name}",
                         marks=[*launcher.marks,
                                *([] if name in FAST[launcher.id] else [pytest.mark.slow])])
            for launcher in (mpich, ompi) for name in sorted(ALGORITHMS)
            if launcher is mpich or name in OPEN_MPI_STRATEGIES]


@pytest.mark.parametrize("name,python,env,transport", _strategy_launchers())
def test_every_strategy_on_two_nodes(cluster, tmp_path, name, python, env, transport):
    out = tmp_path / f"{name}.h5"
    before = TC.link_bytes()
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", str(python), "-m",
                        "syncbench", "train", "--algorithm", name, "--model", "mlp",
                        "--dataset", "fashion-mnist", "--epochs", "0.5", "--eval-every", "0.5",
                        "--progress", "never", "--timeout", "60", *QUICK.get(name, []),
                        "--out", str(out), python=python, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crossed = [sum(b) - sum(a) for a, b in zip(before, TC.link_bytes())]
    run = read_run(out)
    assert run.summary["final_accuracy"] >= MIN_ACCURACY, run.summary["final_accuracy"]
    _check_nodes_and_clocks(run)
    assert transport in json.loads(run.attrs["mpi_transport_env"])
    # the model itself (float32 parameters) crossed each link more than once
    model_bytes = 4 * build_model("mlp", (784,), 10).params.size
    assert min(crossed) > 2 * model_bytes, (crossed, model_bytes)


def test_a_synchronous_run_is_on_one_clock(cluster, tmp_path):
    """SSGD's steps end at its allreduce: on one clock both ranks' step ends agree within
    2 ms in the median and 10 ms at the 95th percentile, though node 2's clock is 1000 s
    ahead. An offset between the clocks moves every step; a rank woken late moves one
    (both ranks share the host's two cores: the wake-up after the allreduce alone differs
    by about a millisecond when other work runs beside them, and one step in CI ended
    57 ms apart), so the bound on the largest gap is only that it is not a clock's
    offset of a second or more."""
    out = tmp_path / "ssgd.h5"
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                        "syncbench", "train", "--algorithm", "ssgd", "--model", "mlp",
                        "--dataset", "synthetic", "--epochs", "1", "--progress", "never",
                        "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    ends = [run.ranks[r]["t_start"][1:] for r in (0, 1)]
    steps = min(len(e) for e in ends)
    gap = np.abs(ends[0][:steps] - ends[1][:steps])
    p95 = np.percentile(gap, 95)
    assert np.median(gap) < 2e-3 and p95 < 0.01 and gap.max() < 1.0, \
        (np.median(gap), p95, gap.max())


def test_a_slurm_job_across_two_nodes(cluster, tmp_path):
    if not cluster["slurm"]:
        if os.environ.get("SYNCBENCH_REQUIRE_SLURM") == "1":
            pytest.fail("SYNCBENCH_REQUIRE_SLURM=1 but no Slurm cluster answers")
        pytest.skip("no Slurm cluster answers (make slurm-up)")
    out = tmp_path / "slurm.h5"
    proc = subprocess.run(
        ["sbatch", "--wait", "-p", "emulated", "-N", "2", "-n", "2",
         "-o", str(tmp_path / "job.out"),
         str(REPO / "jobs" / "slurm" / "train.sbatch"), "--algorithm", "ssgd", "--model", "mlp",
         "--dataset", "fashion-mnist", "--epochs", "0.25", "--progress", "never",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, **TC.env, "SYNCBENCH_VENV": str(Path(sys.executable).parents[1])})
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + log
    assert f"on {TC.prefix}node[1-2]" in log, log
    run = read_run(out)
    _check_nodes_and_clocks(run)
    assert run.attrs["slurm_job_id"]
    assert "UCX_TLS" in json.loads(run.attrs["mpi_transport_env"])  # from the TaskProlog


def test_cluster_errors_are_one_line(cluster):
    again = TC.syncbench("cluster", "up", "--nodes", "3")
    assert again.returncode == 1
    assert again.stderr.strip().count("\n") == 0 and "other settings" in again.stderr
    bad = TC.syncbench("cluster", "up", "--nodes", "2", "--node-speed", "1,2")
    assert bad.returncode == 1 and "--node-speed" in bad.stderr
    node = TC.syncbench("cluster", "exec", "nonode", "--", "true")
    assert node.returncode == 1 and "no node 'nonode'" in node.stderr
    inside = TC.syncbench("cluster", "exec", NODES[1], "--", "hostname")
    assert inside.returncode == 0 and inside.stdout.strip() == NODES[1]


SPEED_SCENARIO = """
description = "live node speeds"
np = 2
repeats = 1
target_accuracy = 0.2
eval_every = 0
node_speeds = ["last:0.5"]
cluster = { link = "1gbit" }
flags = { dataset = "synthetic", synthetic_samples = 512, epochs = 1, batch_size = 64 }

[[run]]
label = "ssgd"
algorithm = "ssgd"
"""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _quota(node: str) -> str:
    return Path(f"/sys/fs/cgroup/cpu/{node}/cpu.cfs_quota_us").read_text().strip()


def test_a_scenario_sets_each_configurations_node_speeds_live(cluster, tmp_path):
    """``node_speeds``: the runner gives node 2 a quota of half its core for that
    configuration's runs only (the run file records the speed on node 2's rank), lifts it
    for the homogeneous run, and leaves the cluster as it found it."""
    scenario = tmp_path / "speeds.toml"
    scenario.write_text(SPEED_SCENARIO)
    out = tmp_path / "runs"
    proc = TC.syncbench("run", str(scenario), "--cluster", "--out-dir", str(out),
                        timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    slow, hom = read_run(out / "ssgd-q1-0.5-r0.h5"), read_run(out / "ssgd-hom-r0.h5")
    assert float(slow.rank_attrs[1]["node_speed"]) == 0.5
    assert float(slow.rank_attrs[0]["node_speed"]) == 1.0
    assert float(hom.rank_attrs[1]["node_speed"]) == 1.0
    # the kernel's bursts, measured inside the node when the quota was set: a share near
    # the nominal one (a tick's overrun takes some of it), and none without a quota
    on, off = (float(slow.rank_attrs[1][f"node_throttle_{k}_s"]) for k in ("on", "off"))
    assert 0.2 <= on / (on + off) <= 0.6 and 0.5e-3 <= on <= 10e-3, (on, off)
    # and the spread of the first burst after an idle spell (where the tick falls)
    low, high = (float(slow.rank_attrs[1][f"node_throttle_first_{k}_s"]) for k in ("lo", "hi"))
    assert 0.2e-3 <= low <= high <= 12e-3, (low, high)
    assert math.isnan(float(slow.rank_attrs[0]["node_throttle_on_s"]))
    assert math.isnan(float(hom.rank_attrs[1]["node_throttle_on_s"]))
    assert "node speed 1,0.5 (CPU quota) against homogeneous" in proc.stdout
    state = json.loads((TC.state_dir / "state.json").read_text())
    assert [n["speed"] for n in state["nodes"]] == [1.0, 1.0]
    if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():  # cgroup v1
        assert _quota(NODES[1]) == "-1"
    live = TC.syncbench("cluster", "speed", NODES[1], "0.25")
    assert live.returncode == 0, live.stderr
    if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
        period = Path(f"/sys/fs/cgroup/cpu/{NODES[1]}/cpu.cfs_period_us").read_text()
        assert int(_quota(NODES[1])) == int(period) // 4
    assert "SYNCBENCH_NODE_SPEED=0.25" in (TC.state_dir / "node-ssh").read_text()
    throttle = json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]["throttle"]
    on, off, first = throttle.split("/")
    assert 0.1 <= float(on) / (float(on) + float(off)) <= 0.4, throttle
    assert 0 < float(first.split("-")[0]) <= float(first.split("-")[1]), throttle
    assert f"SYNCBENCH_NODE_THROTTLE={throttle}" in (TC.state_dir / "node-ssh").read_text()
    back = TC.syncbench("cluster", "speed", NODES[1], "1")
    shim = (TC.state_dir / "node-ssh").read_text()
    assert back.returncode == 0 and "SYNCBENCH_NODE_SPEED" not in shim
    assert "SYNCBENCH_NODE_THROTTLE" not in shim
    assert json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]["throttle"] == ""
    wrong = TC.syncbench("run", "cluster-overlap", "--cluster", "--np", "4")
    assert wrong.returncode == 2 and "needs 4 emulated nodes" in wrong.stderr


def test_no_cluster_is_one_line(tmp_path):
    env = {"SYNCBENCH_CLUSTER_DIR": str(tmp_path / "none")}
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", "true", env=env)
    assert proc.returncode == 1 and "no emulated cluster is up" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    run = TC.syncbench("run", "demo", "--cluster", "--dry-run", env=env)
    assert run.returncode == 2 and "no emulated cluster is up" in run.stderr


def test_the_runners_speed_changes_keep_what_was_changed_meanwhile(cluster, monkeypatch):
    """The runner changes node speeds by a read-modify-write of the state under its lock:
    a ``cluster link`` and a ``cluster speed`` made after the runner started stay in the
    state (and so in what ``down`` removes), and ``node-ssh`` is a new file each time, so
    a launcher's ``sh`` part-way through the old one reads it whole."""
    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(TC.state_dir))
    before, restore = speed_setter()
    shim = TC.state_dir / "node-ssh"
    text = shim.read_bytes()
    path = TC.state_dir / "state.json"
    try:
        with shim.open("rb") as reading:  # as sh reads a script: a part, the rest later
            head = reading.read(64)
            for args in (("link", NODES[0], "500mbit"), ("speed", NODES[0], "0.5")):
                meanwhile = TC.syncbench("cluster", *args)
                assert meanwhile.returncode == 0, meanwhile.stderr
            before(SimpleNamespace(condition=SimpleNamespace(speeds=(1.0, 0.5))))
            state = json.loads(path.read_text())
            assert head + reading.read() == text
            assert os.fstat(reading.fileno()).st_ino != shim.stat().st_ino
        assert state["nodes"][0]["link"] == "500mbit"
        assert [n["speed"] for n in state["nodes"]] == [1.0, 0.5]
        # each node's ranks learn their link's token bucket: 2.1 ms of its rate
        exports = shim.read_text()
        assert "SYNCBENCH_LINK_BURST=131072;" in exports  # 500 Mbit/s: 128 KB
        assert "SYNCBENCH_LINK_BURST=262144;" in exports  # 1 Gbit/s: 256 KB
        recorded = {o["name"] for o in state["made"] if o["kind"] == "cgroup"}
        root = Path("/sys/fs/cgroup")
        for node in NODES:  # every cgroup of a node is one down will remove
            for group in (root / node, *root.glob(f"*/{node}")):
                assert not group.is_dir() or str(group) in recorded, (group, recorded)
        restore()
        assert [n["speed"] for n in json.loads(path.read_text())["nodes"]] == [1.0, 1.0]
    finally:
        TC.syncbench("cluster", "link", NODES[0], "1gbit")
        for node in NODES:
            TC.syncbench("cluster", "speed", node, "1")


def test_a_quota_probe_that_other_work_preempts_is_not_taken_for_the_quota(cluster):
    """The probe of a node's quota spins and counts its frozen spells. A process spinning
    on the node's CPU outside the node cuts its runs short and adds stops of its own to
    its freezes. The probe checks them against the kernel's throttled time (the cgroup's
    ``cpu.stat``), runs again, and after its last try leaves the pattern unmeasured,
    with a note in the state, instead of recording the competitor's share."""
    node = json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]
    if not node.get("cpus"):
        pytest.skip("the node has no CPU of its own on this host (no cpuset)")
    slowed = TC.syncbench("cluster", "speed", NODES[1], "0.5", timeout=120)
    assert slowed.returncode == 0, slowed.stderr
    procs = json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]["cgroup_procs"]
    TC.syncbench("cluster", "speed", NODES[1], "1")
    if not any("throttled_" in _read(Path(p).with_name("cpu.stat")) for p in procs):
        pytest.skip("the node's cgroup counts no throttled time (cpu.stat)")
    cpu = int(node["cpus"].split(",")[0].split("-")[0])
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        slowed = TC.syncbench("cluster", "speed", NODES[1], "0.5", timeout=120)
    finally:
        hog.kill()
        hog.wait()
    try:
        assert slowed.returncode == 0, slowed.stderr  # the quota stands
        after = json.loads((TC.state_dir / "state.json").read_text())
        assert after["nodes"][1]["speed"] == 0.5
        assert after["nodes"][1]["throttle"] == "", after["nodes"][1]
        assert [n for n in after["notes"] if NODES[1] in n and "in each of 3 tries" in n], \
            after["notes"]
        assert slowed.stderr.count("\n") == 1 and "were not measured" in slowed.stderr
        alone = TC.syncbench("cluster", "speed", NODES[1], "0.25", timeout=120)
        assert alone.returncode == 0, alone.stderr
        again = json.loads((TC.state_dir / "state.json").read_text())
        throttle = again["nodes"][1]["throttle"]
        assert throttle.count("/") == 2, throttle  # measured, with nothing competing
        assert not [n for n in again["notes"] if NODES[1] in n], again["notes"]  # not stale
    finally:
        TC.syncbench("cluster", "speed", NODES[1], "1")


# -- the state folder: trusted only when it is root's; down removes only what up made --
TS = TestCluster("ts", "10.84.0", nodes=1)
NODE_JSON = {"index": 1, "name": "tsnode1", "address": "10.84.0.1", "veth": "tsv1"}


def _wake_rows(text: str) -> dict[str, tuple[float, float]]:
    """quota_wakes' rows: {interval: (median running share, median frozen span in ms)}."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and not line.startswith("#") and fields[0] != "wake":
            rows[fields[0]] = (float(fields[1]), float(fields[7]))
    return rows


def _slow_second_node() -> None:
    """Put node 2 at speed 0.5 (the caller sets it back to 1); skip where it has not one
    CPU of its own, where the quota does not throttle one busy process."""
    node = json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]
    if not node.get("cpus") or not node["cpus"].isdigit():
        pytest.skip("the node has not one CPU of its own on this host: the quota does not "
                    "throttle one busy process")
    slowed = TC.syncbench("cluster", "speed", NODES[1], "0.5", timeout=120)
    assert slowed.returncode == 0, slowed.stderr


def test_a_task_that_wakes_on_a_slow_nodes_cpu_shortens_its_quotas_freezes(cluster):
    """The kernel checks a quota at the tick and whenever the scheduler runs. A busy
    process alone on a node at speed 0.5 overruns to the tick and is frozen several ms
    (about 5 on a 250 Hz kernel); a task in the node that wakes every millisecond makes
    the scheduler run in between: freezes of about 1 ms, shorter than without it
    (docs/RESULTS.md, "A quota's share and the wake-ups on its CPU")."""
    _slow_second_node()
    try:
        throttle = json.loads((TC.state_dir / "state.json").read_text())["nodes"][1]["throttle"]
        if not throttle or float(throttle.split("/")[1]) < 3.0:
            pytest.skip(f"the quota's freezes are short here already ({throttle or 'none'}: "
                        "a faster tick)")
        done = TC.syncbench("cluster", "exec", NODES[1], "--", sys.executable, "-m",
                            "syncbench.bench.micro.quota_wakes", "--wake-ms", "0,1",
                            "--seconds", "0.5", "--repeats", "3", timeout=120)
    finally:
        TC.syncbench("cluster", "speed", NODES[1], "1")
    assert done.returncode == 0, done.stderr
    rows = _wake_rows(done.stdout)
    assert set(rows) == {"none", "1"}, done.stdout
    (_, alone_off), (woken, woken_off) = rows["none"], rows["1"]
    # the node's other tasks (its slurmd, where the nodes are in Slurm) wake now and then
    # too, so the spin "alone" may run a finer pattern than the probe's (2.0 ms on and 2.6
    # frozen at the median in one run here, 1.6-3.4 frozen): the waker's freezes are about
    # its interval, and shorter than those
    assert woken_off < 1.5 and woken_off < alone_off, done.stdout
    # the waker's own runs (about 460 a second) count against the same quota, so the spin
    # beside it may run a little less than alone where alone already ran near the quota
    # (0.488 alone against 0.465 woken in one run): it keeps nine tenths of its quota
    assert woken >= 0.9 * 0.5, done.stdout


def test_a_collective_at_a_quota_sees_the_slow_nodes_freezes(cluster, tmp_path):
    """``quota_collective`` reads each node's throttled time from the host while the ranks
    stamp their steps on their nodes' clocks (node 2's is ``OFFSET_S`` ahead): with node 2
    at speed 0.5 and 6 ms of CPU before each Allreduce, its freezes fall in the steps
    (a never-idle process there is frozen more than half the time: 4.7-4.9 ms every 8),
    and node 1, at full speed, has none. Taken on the wrong clock, node 2's freezes would
    fall outside every step."""
    _slow_second_node()
    out = tmp_path / "quota.json"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "syncbench.bench.micro.quota_collective", "--ranks", "2",
             "--spin-ms", "6", "--bytes", "65536", "--steps", "40", "--out", str(out)],
            capture_output=True, text=True, timeout=180, env={**os.environ, **TC.env})
    finally:
        TC.syncbench("cluster", "speed", NODES[1], "1")
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert figures["nodes"] == NODES and figures["quota_read"][NODES[1]], figures
    shares = figures["frozen_share_per_node"]
    assert shares[NODES[0]] == 0.0 and 0.2 < shares[NODES[1]] < 0.9, shares
    assert figures["frozen_per_rank_step_ms"]["compute"] > 0.5, figures
    # the step is node 2's 6 ms of CPU at half a core, at least 10 ms of wall
    assert figures["step_ms"]["median"] > 10.0, figures
    assert "Allreduce after a step" in done.stdout


@pytest.fixture
def ts(tmp_path):
    """A state folder of the test's own (root's, 0755) and ``syncbench`` with its names;
    whatever ``ts`` names are left at the end are taken down and make the test fail."""
    TS.require()
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    env = {"SYNCBENCH_CLUSTER_DIR": str(folder)}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return TS.syncbench(*args, env={**env, **extra}, timeout=60)

    yield folder, run
    if folder.is_dir() and not folder.is_symlink():
        os.chown(folder, 0, 0)
        folder.chmod(0o755)
    run("cluster", "down")
    left = TS.leftovers()
    for what in left:
        kind, name = what.split(" ", 1)
        if kind == "cgroup":
            os.rmdir(name)
        else:
            subprocess.run(["ip", *(["netns", "del"] if kind == "netns" else ["link", "del"]),
                            name], capture_output=True)
    assert left == [], left


def _one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


def _first_cgroup(node: str) -> Path:
    """The cgroup ``up --node-speed 0.5`` makes first for ``node``."""
    root = Path("/sys/fs/cgroup")
    if (root / "cpu" / "cpu.cfs_quota_us").exists():
        return root / ("cpuset" if (root / "cpuset").is_dir() else "cpu") / node
    return root / node


def test_down_and_a_failed_up_remove_only_the_files_they_wrote(ts):
    folder, run = ts
    (folder / "my-notes.txt").write_text("mine\n")
    started = run("cluster", "up", "--nodes", "1")
    assert started.returncode == 0, started.stderr
    assert {p.name for p in folder.iterdir()} == {"my-notes.txt", "node-ssh", "state.json"}
    down = run("cluster", "down")
    assert down.returncode == 0, down.stderr
    assert [p.name for p in folder.iterdir()] == ["my-notes.txt"]
    assert (folder / "my-notes.txt").read_text() == "mine\n"
    # an up that fails half-way (a cgroup of its node's name exists) removes what it
    # made, and neither that cgroup nor the folder's other file
    group = _first_cgroup("tsnode1")
    group.mkdir()
    try:
        _one_line(run("cluster", "up", "--nodes", "1", "--node-speed", "0.5"),
                  f"cgroup {group} already exists")
        assert group.is_dir()
    finally:
        group.rmdir()
    assert [p.name for p in folder.iterdir()] == ["my-notes.txt"]


@pytest.mark.parametrize("unsafe", ["group-writable", "other-owned", "symlink"])
def test_a_state_folder_only_root_controls_is_required(ts, tmp_path, unsafe):
    folder, run = ts
    (folder / "state.json").write_text(json.dumps({"nodes": [NODE_JSON]}))
    if unsafe == "group-writable":
        folder.chmod(0o775)
    elif unsafe == "other-owned":
        os.chown(folder, 65534, 65534)
    link = tmp_path / "link"
    link.symlink_to(folder)
    where = {"SYNCBENCH_CLUSTER_DIR": str(link)} if unsafe == "symlink" else {}
    for action in (["status"], ["down"], ["up", "--nodes", "1"], ["exec", "tsnode1", "true"]):
        _one_line(run("cluster", *action, **where), "refused")
    assert TS.leftovers() == []


def test_a_launcher_shim_or_state_file_root_did_not_write_is_not_used(ts, tmp_path):
    """``cluster exec``/``mpiexec`` execute ``node-ssh`` as root: one others can write is
    refused, as is a state file whose names would reach shell text."""
    folder, run = ts
    (folder / "state.json").write_text(json.dumps({"nodes": [NODE_JSON]}))
    marker = tmp_path / "ran"
    shim = folder / "node-ssh"
    shim.write_text(f"#!/bin/sh\ntouch {marker}\n")
    shim.chmod(0o777)
    _one_line(run("cluster", "exec", "tsnode1", "--", "true"), "node-ssh", "refused")
    os.chown(shim, 65534, 65534)
    shim.chmod(0o755)
    _one_line(run("cluster", "mpiexec", "-n", "1", "--", "true"), "node-ssh", "refused")
    assert not marker.exists()
    bad = {**NODE_JSON, "name": f"ts;touch {marker}"}
    (folder / "state.json").write_text(json.dumps({"nodes": [bad]}))
    _one_line(run("cluster", "status"), "refused")
    shim.unlink()
    (folder / "state.json").unlink()


def test_symlinks_in_the_state_folder_are_replaced_not_followed(ts, tmp_path, monkeypatch):
    folder, run = ts
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    victim.chmod(0o600)
    for name in ("state.tmp", "state.json.tmp", "node-ssh"):
        (folder / name).symlink_to(victim)
    # up refuses a folder that holds a file of its own names it did not write
    _one_line(run("cluster", "up", "--nodes", "1"), "node-ssh")
    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(folder))
    cluster = state.Cluster(nodes=[state.Node(**NODE_JSON)])
    state.save(cluster)
    launch.write_shim(cluster)
    assert victim.read_text() == "victim\n" and victim.stat().st_mode & 0o777 == 0o600
    assert not (folder / "node-ssh").is_symlink() and not (folder / "state.json").is_symlink()
    assert (folder / "state.tmp").is_symlink()  # not the cluster's: left as it is
    for name in ("state.tmp", "state.json.tmp", "node-ssh", "state.json"):
        (folder / name).unlink()


@pytest.mark.parametrize("case", ["identity", "reboot"])
def test_down_leaves_alone_what_up_did_not_make(ts, case):
    """A state file lists objects whose identity is not the recorded one (made by someone
    else under the cluster's names, or the host rebooted since): ``down`` leaves each
    alone, in one line, and removes nothing."""
    folder, run = ts
    group = _first_cgroup("tsnode1")
    made = []
    try:
        subprocess.run(["ip", "link", "add", "tsbr0", "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "add", "tsx", "type", "bridge"], check=True)
        subprocess.run(["ip", "netns", "add", "tsnode1"], check=True)
        group.mkdir()
        real = {"tsbr0": int(Path("/sys/class/net/tsbr0/ifindex").read_text()),
                "tsnode1": os.stat("/run/netns/tsnode1").st_ino, "group": group.stat().st_ino}
        shift = 0 if case == "reboot" else 100_000
        made = [{"kind": "link", "name": "tsbr0", "ifindex": real["tsbr0"] + shift},
                {"kind": "netns", "name": "tsnode1", "inode": real["tsnode1"] + shift},
                {"kind": "cgroup", "name": str(group), "inode": real["group"] + shift},
                {"kind": "link", "name": "tsv1", "ifindex": 1},  # gone: nothing to say
                {"kind": "link", "name": "tsx"}]  # not a name of this cluster
        (folder / "state.json").write_text(json.dumps(
            {"nodes": [NODE_JSON], "bridge": "tsbr0", "bridge_address": "10.84.0.254",
             "made": made, **({"boot_id": "another boot"} if case == "reboot" else {})}))
        down = run("cluster", "down")
        assert down.returncode == 0, down.stderr
        lines = [ln for ln in down.stderr.splitlines() if " alone: " in ln]
        assert len(lines) == 4, down.stderr
        assert all(Path("/sys/class/net", n).exists() for n in ("tsbr0", "tsx"))
        assert Path("/run/netns/tsnode1").exists() and group.is_dir()
        assert not (folder / "state.json").exists()
    finally:
        for link in ("tsbr0", "tsx"):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "netns", "del", "tsnode1"], capture_output=True)
        if group.is_dir():
            group.rmdir()


def test_a_subnet_the_host_routes_already_is_refused(ts):
    folder, run = ts
    try:
        for args in (["link", "add", "tsx", "type", "bridge"],
                     ["addr", "add", "10.84.0.1/24", "dev", "tsx"], ["link", "set", "tsx", "up"]):
            subprocess.run(["ip", *args], check=True)
        _one_line(run("cluster", "up", "--nodes", "1"), "10.84.0.0/24 overlaps",
                  "10.84.0.0/24 dev tsx")
        assert not Path("/sys/class/net/tsbr0").exists() and not (folder / "state.json").exists()
    finally:
        subprocess.run(["ip", "link", "del", "tsx"], capture_output=True)


@pytest.mark.parametrize("name,value", [
    ("SYNCBENCH_CLUSTER_PREFIX", "a;b"), ("SYNCBENCH_CLUSTER_PREFIX", "toolongprefix"),
    ("SYNCBENCH_CLUSTER_SUBNET", "10.84.0;true"), ("SYNCBENCH_CLUSTER_SUBNET", "8.8.8"),
    ("SYNCBENCH_CLUSTER_SUBNET", "10.84.300")])
def test_bad_names_and_subnets_are_refused_before_anything_is_made(ts, name, value):
    folder, run = ts
    try:
        _one_line(run("cluster", "up", "--nodes", "1", **{name: value}), name)
        assert not (folder / "state.json").exists()
        assert not [p for p in Path("/sys/class/net").iterdir() if p.name.startswith("a;b")]
    finally:
        run("cluster", "down", **{name: value})


def test_a_second_up_fails_at_once_naming_the_holder(ts, monkeypatch):
    folder, run = ts
    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(folder))
    with state.locked():
        started = time.monotonic()
        _one_line(run("cluster", "up", "--nodes", "1"), "in use by another process",
                  f"pid {os.getpid()}")
        assert time.monotonic() - started < 10
    assert TS.leftovers() == [] and not (folder / "state.json").exists()
