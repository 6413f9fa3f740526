"""Compatibility name of :mod:`syncbench.bench.slowdown` (the slowdown emulation).

``syncbench hetero`` is the command (:mod:`syncbench.bench.hetero_bench`);
import the emulation from :mod:`syncbench.bench.slowdown`.
"""

from syncbench.bench.slowdown import (  # noqa: F401
    SLOWDOWN_MODES,
    ModelWork,
    Slowdown,
    make_slowdown,
    parse_slowdown,
    parse_slowdown_schedule,
    resolve_mode,
)
