"""What a rank's launcher tells it about its node: the emulated cluster's shim (or Slurm's
TaskProlog) exports the node's CPU quota, how the kernel realises it, and the token bucket
of its link (``node_env`` in ``bench/cluster/launch.py``); a run records them as rank
attributes (``analysis/schema.py``) for ``simulate --validate``. Each reader gives the
neutral value (1.0, NaN) where the variable is unset or not what it should be."""

from __future__ import annotations

import math
import os


def node_speed() -> float:
    """The CPU share this rank's node runs at, as its launcher says (``$SYNCBENCH_NODE_SPEED``:
    the emulated cluster's ``--node-speed``, a CFS quota); 1.0 when unset or not a share."""
    try:
        speed = float(os.environ.get("SYNCBENCH_NODE_SPEED", "1"))
    except ValueError:
        return 1.0
    return speed if 0 < speed <= 1 else 1.0


def node_throttle() -> dict[str, float]:
    """``node_throttle_on_s`` and ``node_throttle_off_s``: the running and frozen spans of
    this rank's node's quota as the cluster measured them, and ``node_throttle_first_lo_s``
    and ``node_throttle_first_hi_s``, the 10th and 90th percentiles of a first run after
    an idle spell (``$SYNCBENCH_NODE_THROTTLE``, ``ON/OFF[/LO-HI]`` in milliseconds); NaN
    where unset, not positive numbers, or LO above HI (the first two alone where the
    spread is absent: a cluster brought up before it was measured)."""
    keys = ("node_throttle_on_s", "node_throttle_off_s", "node_throttle_first_lo_s",
            "node_throttle_first_hi_s")
    out = dict.fromkeys(keys, float("nan"))
    on, _, rest = os.environ.get("SYNCBENCH_NODE_THROTTLE", "").partition("/")
    off, _, first = rest.partition("/")
    low, _, high = first.partition("-")
    for names, texts in ((keys[:2], (on, off)), (keys[2:], (low, high))):
        try:
            values = [float(text) / 1e3 for text in texts]
        except ValueError:
            break
        if not all(math.isfinite(v) and v > 0 for v in values):
            break
        if names == keys[2:] and values[0] > values[1]:  # LO above HI: not a spread
            break
        out.update(zip(names, values))
    return out


def link_burst() -> float:
    """Bytes of the token bucket of this rank's node's link, as its launcher says
    (``$SYNCBENCH_LINK_BURST``, the emulated cluster's shaping); NaN when unset."""
    try:
        burst = float(os.environ.get("SYNCBENCH_LINK_BURST", "nan"))
    except ValueError:
        return float("nan")
    return burst if math.isfinite(burst) and burst > 0 else float("nan")
