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


@pytest.mark.parametrize("burst, segment", [("51kb", 32768), ("256kb", 65536), ("96kb", 65536),
                                            ("32kb", 16384), ("4kb", 4096)])
def test_a_shaped_links_tcp_segments_fit_its_bucket_with_their_headers(burst, segment):
    limit = network.segment_limit(burst)
    assert limit == segment
    # the packets a segment becomes carry 66 bytes of headers each (1,448 bytes of payload)
    assert limit + -(-limit // 1448) * 66 <= network.size_bytes(burst) or limit == 4096

