"""The graphs of decentralized SGD (no MPI): weights, validation and spectral gaps."""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.graphs import (
    build_graph,
    exp_tau,
    one_peer_offset,
    spectral_gap,
    torus_shape,
)

NAMED = ("ring", "torus", "exp", "onepeer-exp")


def dense_gap(cycle) -> float:
    n = cycle[0].size
    product = np.eye(n)
    for mixing in cycle:
        product = mixing.matrix() @ product
    return 1.0 - float(np.linalg.norm(product - 1.0 / n, 2))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 8, 9, 12, 16])
@pytest.mark.parametrize("spec", NAMED)
def test_named_graphs_are_doubly_stochastic_and_their_dft_gap_is_the_dense_one(spec, size):
    if spec == "torus" and size in (2, 3, 5):
        pytest.skip("no torus of a prime rank count")
    graph = build_graph(spec, size)
    for mixing in graph.cycle:
        w = mixing.matrix()
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-15)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-15)
        for i in range(size):  # the MPI lists are the matrix's off-diagonal pattern
            assert mixing.sources(i) == [j for j in range(size) if j != i and w[i, j] > 0]
            assert mixing.destinations(i) == [k for k in range(size) if k != i and w[k, i] > 0]
            assert mixing.weights(i) == [w[i, j] for j in mixing.sources(i)]
    assert graph.spectral_gap() == pytest.approx(dense_gap(graph.cycle), abs=1e-12)
    assert 0 < graph.spectral_gap() <= 1 + 1e-12


def test_ring_and_torus_have_metropolis_hastings_weights():
    w = build_graph("ring", 5).cycle[0].matrix()
    assert w[0, 1] == w[0, 4] == 1 / 3 and w[0, 0] == pytest.approx(1 / 3) and w[0, 2] == 0
    w2 = build_graph("ring", 2).cycle[0].matrix()  # one neighbour, listed once
    np.testing.assert_array_equal(w2, [[0.5, 0.5], [0.5, 0.5]])
    t = build_graph("torus:3x4", 12).cycle[0]
    assert t.sources(0) == [1, 3, 4, 8] and t.weights(0) == [0.2] * 4
    assert build_graph("torus:2x4", 8).cycle[0].weights(0) == [0.25] * 3  # up = down


def test_exponential_graphs_follow_their_definition():
    """Ying et al. 2021: rank i receives from i + 2^k, weights 1/(tau+1); the one-peer
    graph at step t from i + 2^(t mod tau) only, weights 1/2."""
    for n in (3, 5, 8, 12):
        tau = exp_tau(n)
        assert 2 ** (tau - 1) < n <= 2 ** tau
        w = build_graph("exp", n).cycle[0].matrix()
        for i in range(n):
            expected = {i, *((i + 2 ** k) % n for k in range(tau))}
            assert {j for j in range(n) if w[i, j] > 0} == expected
            assert all(w[i, j] == pytest.approx(1 / (tau + 1)) for j in expected)
        graph = build_graph("onepeer-exp", n)
        assert len(graph.cycle) == tau
        for t in range(3 * tau):
            mixing = graph.at(t)
            assert one_peer_offset(t, n) == 2 ** (t % tau)
            for i in range(n):
                peer = (i + one_peer_offset(t, n)) % n
                assert mixing.sources(i) == [peer] and mixing.weights(i) == [0.5]
                assert mixing.self_weights[i] == 0.5
                assert mixing.destinations(i) == [(i - one_peer_offset(t, n)) % n]


def test_one_peer_cycle_averages_exactly_at_a_power_of_two():
    for n in (2, 4, 8, 16, 64):
        graph = build_graph("onepeer-exp", n)
        product = np.eye(n)
        for mixing in graph.cycle:
            product = mixing.matrix() @ product
        np.testing.assert_allclose(product, 1.0 / n, rtol=0, atol=1e-15)
        assert graph.spectral_gap() == pytest.approx(1.0)
    assert build_graph("onepeer-exp", 6).spectral_gap() < 1.0


def test_gaps_at_scale_are_computed_without_a_dense_matrix():
    gaps = {spec: build_graph(spec, 16384).spectral_gap() for spec in NAMED}
    tau = 14
    assert gaps["exp"] == pytest.approx(2 / (tau + 1))  # Ying et al.: 1 - rho = 2/(tau+1)
    assert gaps["onepeer-exp"] == pytest.approx(1.0)
    # ring: 1 - (1/3 + 2/3 cos(2 pi / N)); torus 128 x 128: 1 - (1/5 + 4/5 cos(2 pi / 128))
    assert gaps["ring"] == pytest.approx(2 / 3 * (1 - np.cos(2 * np.pi / 16384)), rel=1e-6)
    assert gaps["torus"] == pytest.approx(2 / 5 * (1 - np.cos(2 * np.pi / 128)), rel=1e-9)


def test_torus_shape():
    assert torus_shape(16) == (4, 4) and torus_shape(12) == (3, 4) and torus_shape(64) == (8, 8)
    assert torus_shape(6, "2x3") == (2, 3)
    with pytest.raises(ValueError, match="does not fit 6 ranks"):
        build_graph("torus:4x4", 6)
    with pytest.raises(ValueError, match="torus does not fit 7 ranks"):
        build_graph("torus", 7)
    with pytest.raises(ValueError, match="expected torus:RxC"):
        build_graph("torus:4by4", 16)


def write(tmp_path, text: str):
    path = tmp_path / "graph.txt"
    path.write_text(text)
    return str(path)


def test_a_graph_file_with_and_without_weights(tmp_path):
    # a path 0 - 1 - 2 - 3 plus a chord: Metropolis-Hastings weights
    path = write(tmp_path, "# a small graph\n0 1\n1 2\n2 3\n3 1  # chord\n")
    w = build_graph(path, 4).cycle[0].matrix()
    degree = [1, 3, 2, 2]
    for i, j in [(0, 1), (1, 2), (2, 3), (1, 3)]:
        assert w[i, j] == w[j, i] == pytest.approx(1 / (1 + max(degree[i], degree[j])))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-15)
    weighted = write(tmp_path, "0 1 0.5\n1 2 0.5\n2 3 0.5\n3 0 0.5\n")
    graph = build_graph(weighted, 4)
    assert graph.cycle[0].self_weights == (0.0, 0.0, 0.0, 0.0)
    assert graph.spectral_gap() == pytest.approx(dense_gap(graph.cycle))  # dense path


@pytest.mark.parametrize("text, size, message", [
    ("0 1\n1 4\n", 4, "rank 4 is out of range for 4 ranks"),
    ("0 1\n1 -1\n", 4, "rank -1 is out of range"),
    ("0 1 0.7\n1 2 0.7\n", 3, "not doubly stochastic"),
    ("0 1\n2 3\n", 4, "disconnected"),
    ("0 1 0.5\n1 2\n", 3, "every edge or on none"),
    ("0 0\n", 2, "self-loop"),
    ("0 1\n1 0\n", 2, "listed twice"),
    ("0 one\n", 2, "not numbers"),
    ("0 1 2 3\n", 4, "expected 'i j' or 'i j weight'"),
    ("0 1 -0.5\n", 2, "must be positive"),
    ("", 2, "no edges"),
])
def test_bad_graph_files_fail_with_one_line(tmp_path, text, size, message):
    with pytest.raises(ValueError, match=message) as info:
        build_graph(write(tmp_path, text), size)
    assert "\n" not in str(info.value)


def test_a_missing_file_and_the_trivial_graph(tmp_path):
    with pytest.raises(ValueError, match="cannot read it"):
        build_graph(str(tmp_path / "nope.txt"), 4)
    for spec in ("ring", "exp", "onepeer-exp"):
        graph = build_graph(spec, 1)
        assert graph.cycle[0].sources(0) == [] and graph.spectral_gap() == 1.0
    assert spectral_gap(build_graph("ring", 3).cycle) == pytest.approx(1.0)  # complete K3
