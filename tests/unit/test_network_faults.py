"""Faults only a network brings: the hang guard's probes (no root) and, on the emulated
cluster (``syncbench cluster``, as root, marked ``cluster``), a link taken down and a
node's ranks killed in the middle of a run, under MPICH and Open MPI.

The cluster tests bring up their own 2-node cluster (prefix ``tf``, subnet 10.81.0,
links unshaped) and take it down at the end. Without root (or ``ip``/``unshare``) they
skip, unless ``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
A node's ranks are found through ``ip netns pids`` (a node is a network namespace only:
``pkill`` inside it would see, and kill, every process of the host).

Split off this module: ``tests/e2e/test_network_faults_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import socket

from syncbench.bench.mpi import reach
from syncbench.bench.mpi.watchdog import Survey, Watchdog, _ranks


# -- the guard's probes and line (no root, no MPI job) ------------------------------
def _silent_listener() -> tuple[socket.socket, socket.socket]:
    """A loopback port that never answers: listening with a backlog of 0 and its accept
    queue filled by one connection nobody accepts, so Linux drops every further SYN
    (``tcp_conn_request``: a full accept queue drops the SYN, no RST) and a connect only
    times out, as to a host that is gone from the network. An unrouted address (TEST-NET)
    is not silent everywhere: a host's transparent proxy may answer for any address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    return server, socket.create_connection(server.getsockname(), timeout=1)


def test_probe_tells_a_live_rank_from_a_gone_one_and_a_silent_address():
    listener = reach.Listener()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    gone_port = closed.getsockname()[1]
    closed.close()  # bound, never listening: the port refuses
    silent = _silent_listener()
    quiet = silent[0].getsockname()
    try:
        found = reach.probe({"live": [("127.0.0.1", listener.port)],
                             "gone": [("127.0.0.1", gone_port)],
                             "silent": [quiet],
                             "either": [quiet, ("127.0.0.1", listener.port)]},
                            timeout=0.5)
    finally:
        listener.close()
        for sock in silent:
            sock.close()
    assert found == {"live": reach.ANSWERS, "gone": reach.REFUSED,
                     "silent": reach.UNREACHABLE, "either": reach.ANSWERS}


def test_targets_use_loopback_on_the_host_and_only_addresses_one_host_has():
    peers = [reach.Peer(0, "a", ("10.0.0.1", "172.17.0.1"), 1000),
             reach.Peer(1, "a", ("10.0.0.1", "172.17.0.1"), 1001),
             reach.Peer(2, "b", ("10.0.0.2", "172.17.0.1"), 1002)]
    where = reach.targets(peers[0], peers[1:], peers)
    assert where == {1: [("127.0.0.1", 1001)], 2: [("10.0.0.2", 1002)]}


def test_launcher_addresses_from_hydra_and_prrte_command_lines():
    assert reach.addresses_in(["hydra_pmi_proxy", "--control-port", "10.79.0.254:37475",
                               "--proxy-id", "1"]) == ["10.79.0.254"]
    uri = "prterun-vm-1@0.0;tcp://192.0.2.2,10.79.0.254:55453:64,24,24;tcp6://[fd00::2]:1:64"
    assert reach.addresses_in(["prted", "--prtemca", "prte_hnp_uri", f'"{uri}"']) == \
        ["192.0.2.2", "10.79.0.254"]
    assert reach.addresses_in(["python", "-m", "syncbench"]) == []


def test_the_prrte_process_to_end_is_the_one_the_launcher_started():
    assert reach.prrte_root([(12, "prted"), (11, "prted")]) == 11  # ssh: prted forks one
    assert reach.prrte_root([(12, "prterun")]) == 12  # a rank on the launcher's host
    assert reach.prrte_root([(12, "hydra_pmi_proxy"), (11, "mpiexec")]) is None
    assert reach.prrte_root([]) is None


def test_ranks_are_listed_in_spans():
    assert _ranks([3]) == "rank 3"
    assert _ranks([7, 1, 4, 5, 6]) == "ranks 1, 4-7"


def test_the_line_names_the_unreachable_node_and_the_gone_rank(tmp_path):
    peers = [reach.Peer(0, "n1", ("10.0.0.1",), 1), reach.Peer(1, "n2", ("10.0.0.2",), 2),
             reach.Peer(2, "n2", ("10.0.0.2",), 3), reach.Peer(3, "n3", ("10.0.0.3",), 4)]
    guard = Watchdog(tmp_path, 0, 4, 10.0, peers=peers)
    for rank, beat in enumerate(["12 wait", "11 comm", "12 wait", "12 wait"]):
        (tmp_path / f"heartbeat-{rank:05d}").write_text(f"{beat} 0\n")
    survey = Survey(status={1: reach.UNREACHABLE, 2: reach.UNREACHABLE, 3: reach.REFUSED},
                    launcher=reach.ANSWERS)
    line = guard.describe(10.2, survey)
    assert line == (
        "syncbench: rank 0: no progress for 10 s (--timeout 10) in step 0; ranks that had "
        "not arrived: none (every rank is blocked in MPI); node n2 (ranks 1-2) cannot be "
        "reached from n1 (rank 0): a network fault; rank 3 on n3 ended (the node answers, "
        "the rank does not); aborting the job")
