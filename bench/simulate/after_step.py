"""Short collectives after a training step, as measured (``--calibrate-after-step``).

The compressing reducers' collectives are short (PowerSGD's P and Q, top-k's gather:
3-19 KB on mlp, lenet and resnet8) and come once a step, after backward and the encode.
On the emulated links the token bucket has refilled by then and passes them at once,
and what they cost is not the link's rate but what a process fresh from a step adds to
a message: 0.04-0.08 ms each on 2 nodes at 200 Mbit/s, against 0.25-0.71 back to back
and 0.02-0.04 after a spin of the same length (docs/RESULTS.md, "A short collective
after compute" and "A short collective after a training step, calibrated"). The
back-to-back calibration (``--calibrate``) over-charged top-k on mlp at 200 Mbit/s by a
fifth of its step; the bucket alone (``--link-burst``) under-charged PowerSGD, whose two
collectives each cost more than their bytes.

``python -m syncbench.bench.micro.after_idle --model NAME --out FILE.json`` measures
them: both ranks run one forward and backward of the model, then post the collective
(``Iallreduce`` of float32, ``Iallgather`` of bytes, as the reducers post them); the
later rank's time, the median per operation and size. :class:`AfterStep` gives a
collective of a size within the measured range its time by log-log interpolation
between the measured sizes; outside that range, at another world size, or for an
operation not measured (the all-to-all of fp16, bf16 and int8), ``None``: the
simulator's own chain (:func:`.compressed.chain_stages`).

The harness's own cost around each call (the phase timers, the communicator's wrapper)
is not in the micro-benchmark. It is in the 1-rank codec run's ``comm`` and ``wait``
(a collective of one rank moves nothing), which :func:`.compressed.compressed_ssgd`
adds per step where this calibration applies.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import numpy as np

#: The chain's operation names (:func:`.compressed.collectives`) and the table each reads.
TABLE_OF = {"allreduce": "allreduce", "allgather": "allgather", "allgatherv": "allgather"}


@dataclass(frozen=True)
class AfterStep:
    """Measured seconds of a short collective after a step, per operation and size."""

    source: str
    world_size: int
    model: str
    #: operation -> (sizes in bytes, increasing; median seconds of the later rank)
    tables: dict[str, tuple[np.ndarray, np.ndarray]]

    def seconds(self, kind: str, nbytes: float, n: int) -> float | None:
        """Seconds of collective ``kind`` of ``nbytes`` per rank on ``n`` ranks after a
        step, or None where the calibration does not say (see the module's docstring)."""
        table = self.tables.get(TABLE_OF.get(kind, ""))
        if table is None or n != self.world_size:
            return None
        sizes, seconds = table
        if not sizes[0] <= nbytes <= sizes[-1]:
            return None
        return float(np.exp(np.interp(math.log(nbytes), np.log(sizes), np.log(seconds))))

    def describe(self) -> str:
        ops = ", ".join(f"{op} {int(t[0][0])}-{int(t[0][-1])} B" for op, t in
                        sorted(self.tables.items()))
        return f"{self.source} (after a step of {self.model}; {ops})"


@functools.cache
def load_after_step(path: str) -> AfterStep:
    """The calibration of ``path`` (``after_idle --out``); ``ValueError``, one line naming
    the flag and the file, where it cannot be read or holds no usable table."""
    flag = f"--calibrate-after-step {path}"
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
    except OSError as exc:
        raise ValueError(f"{flag}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{flag}: not a JSON file (python -m "
                         "syncbench.bench.micro.after_idle --out writes one)") from None
    try:
        sizes = np.asarray(data["sizes"], dtype=float)
        world = int(data["world_size"])
        if sizes.ndim != 1:
            raise ValueError
        tables = {}
        for op, medians in data["ops"].items():
            seconds = np.asarray(medians["after_s"], dtype=float)
            if op not in TABLE_OF.values() or seconds.shape != sizes.shape:
                raise ValueError
            tables[op] = (sizes, seconds)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{flag}: not an after_idle calibration (its sizes, world_size "
                         "and ops' after_s)") from None
    if data.get("model") is None:
        raise ValueError(f"{flag}: measured after a spin, not a step: measure with "
                         "after_idle --model NAME")
    ok = (sizes.size >= 1 and np.all(np.diff(sizes) > 0) and np.all(sizes > 0)
          and all(np.all(np.isfinite(s) & (s > 0)) for _, s in tables.values()))
    if not tables or not ok:
        raise ValueError(f"{flag}: needs increasing positive sizes and a positive time for "
                         "each")
    return AfterStep(str(path), world, str(data["model"]), tables)
