"""The emulated link's token bucket: ``--burst auto`` sizes it from the rate."""

from __future__ import annotations

import pytest

from syncbench.bench.cluster import network
from syncbench.bench.cluster.actions import rate_bytes_per_s


@pytest.mark.parametrize("rate, size", [("1gbit", "256kb"), ("200mbit", "51kb"),
                                        ("10mbit", "32kb"), ("100mbps", "205kb")])
def test_auto_holds_2_1_ms_of_the_rate_and_at_least_32_kb(rate, size):
    assert network.bucket(rate_bytes_per_s(rate), "auto") == size


def test_a_size_given_is_kept():
    assert network.bucket(rate_bytes_per_s("200mbit"), "256kb") == "256kb"
