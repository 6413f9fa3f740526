"""Bucket plans of a flat gradient: which slices are reduced together, in the order
backward finishes them. Pure arithmetic (no MPI), shared by the bucketed reducer and
the simulator.

A bucket is closed *before* adding a layer whose gradient would overflow it, as
PyTorch DDP assigns parameters to buckets (``bucket_cap_mb``; Li et al., VLDB 2020,
"PyTorch Distributed"), so a large first layer, whose gradient arrives last, gets a
bucket of its own and the buckets before it overlap its backward. ``--bucket-mb auto``
(the default) is a quarter of the model's gradient, at most 25 MB (DDP's default cap):
every model with two or more layers of parameters then gets at least two buckets
(``mlp``: 2, ``lenet``: 3).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

#: ``--bucket-mb auto``: this fraction of the model's gradient, capped at DDP's default.
AUTO_BUCKET_FRACTION = 0.25
AUTO_BUCKET_CAP_MB = 25.0


def bucket_mb_arg(text: str) -> str | float:
    """``--bucket-mb``: ``auto`` or a number of MB."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number of MB, got {text!r}") from None


def bucket_bytes(bucket_mb: str | float, grad_nbytes: int) -> int:
    """The bucket size in bytes for ``--bucket-mb`` (``auto``: see the module docstring)."""
    if bucket_mb == "auto":
        return max(1, int(min(AUTO_BUCKET_FRACTION * grad_nbytes, AUTO_BUCKET_CAP_MB * 1e6)))
    return max(1, int(float(bucket_mb) * 1e6))


def plan_buckets(
    layer_offsets: Sequence[int], size: int, bucket_elems: int
) -> list[tuple[int, int]]:
    """Buckets ``[start, end)`` of a flat gradient, in the order backward completes them.

    Layer ``i`` owns ``[layer_offsets[i], layer_offsets[i + 1])`` (the last one
    up to ``size``). Walking layers in reverse, a bucket is closed before a
    layer whose elements would take it past ``bucket_elems`` (a layer larger
    than that gets a bucket of its own); layers without parameters are
    skipped. The buckets tile ``[0, size)`` exactly.
    """
    bounds = [*layer_offsets[1:], size]
    buckets: list[tuple[int, int]] = []
    start = end = size
    for lo, hi in zip(reversed(layer_offsets), reversed(bounds)):
        if hi <= lo:
            continue
        if start < end and (end - start) + (hi - lo) > bucket_elems:
            buckets.append((start, end))
            end = start
        start = lo
    if start < end:
        buckets.append((start, end))
    return buckets


def model_bucket_plan(model: object, bucket_mb: str | float) -> list[tuple[int, int]]:
    """``model``'s buckets for ``--bucket-mb`` (its layer offsets, size and gradient)."""
    grads = model.grads
    elems = max(1, bucket_bytes(bucket_mb, grads.nbytes) // grads.itemsize)
    return plan_buckets(model.layer_offsets, model.size, elems)
