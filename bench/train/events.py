"""A rank's collective events: each call's post, completion, bytes and wait, kept bounded.

Phase sums say how long a step communicated, not when each reduction ran.
:class:`EventLog` records every collective a strategy makes through the
communicator (and ASGD's RMA epochs), which calls it as its
:class:`~syncbench.algorithms.communicator.EventSink`: the step, the kind (a
name of ``schema.EVENT_KINDS``, stored as its position), its place among the
step's calls of that kind (SSGD's bucket), the clock at the post and at the
completion the rank observed, the bytes, and the seconds the rank blocked
waiting for it, as Horovod's timeline and torch.profiler record per-operation
events and DeepSpeed's comms logger counts calls, sizes and latencies.

The log is a fixed set of preallocated NumPy columns (``capacity`` events): a
post or a completion writes a few slots (the caller reads the clock); nothing but
a request in flight's dict entry is allocated per event. When the buffer is
full the log keeps a stride sample of whole steps: it keeps the steps that are
multiples of ``stride``, and on filling up it doubles the stride and compacts
itself in place (the steps that are not multiples of the new stride go), so
every kept step holds all its events and the sample spans the whole run.
:meth:`EventLog.attrs` says what was kept (``stride``, ``recorded``,
``dropped``). Times are ``time.monotonic``, the clock of the step rows; the
driver maps them onto the run's clock as it does ``t_start``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from syncbench.analysis import schema

#: Events kept per rank (about 45 bytes each).
DEFAULT_CAPACITY = 1 << 16
#: Codes of the event kinds (``schema.EVENT_KINDS``'s positions).
KIND: dict[str, int] = {name: code for code, name in enumerate(schema.EVENT_KINDS)}


class EventLog:
    """One rank's collective events in preallocated columns (``schema.EVENT_COLUMNS``)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"event capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._cols = {name: np.zeros(capacity, dtype=dtype)
                      for name, dtype in schema.EVENT_COLUMNS.items()}
        self._step, self._index = self._cols["step"], self._cols["index"]
        self._kind, self._bytes = self._cols["kind"], self._cols["bytes"]
        self._t_post, self._t_done = self._cols["t_post"], self._cols["t_done"]
        self._wait = self._cols["wait_s"]
        self.count = 0
        #: Keep the steps that are multiples of this (doubles when the buffer fills).
        self.stride = 1
        #: Events posted while recording, kept or not; and those not kept.
        self.recorded = 0
        self.dropped = 0
        #: False until :meth:`start` (set-up traffic before time 0 is not recorded).
        self.recording = False
        self._pending: dict[int, int] = {}  # id(request) -> slot, until completed
        self._ordinal = [0] * len(schema.EVENT_KINDS)  # a list: cheaper than NumPy scalars
        self._ordinal_step = -1

    def start(self) -> None:
        """Record from now on (the driver calls it at time 0 of the run)."""
        self.recording = True

    def post(self, kind: str, nbytes: int, step: int, t_post: float, key: int | None = None,
             t_done: float = float("nan"), wait_s: float = 0.0) -> int:
        """Record a ``kind`` call posted at ``t_post``; returns its slot (-1 when not kept).

        A nonblocking call passes ``key`` (its request's ``id``) and is completed by
        :meth:`complete`; a blocking one passes ``t_done`` (and ``wait_s``).
        """
        if step != self._ordinal_step:
            self._ordinal = [0] * len(schema.EVENT_KINDS)
            self._ordinal_step = step
        code = KIND[kind]
        index = self._ordinal[code]
        self._ordinal[code] = index + 1
        self.recorded += 1
        if step % self.stride:
            self.dropped += 1
            return -1
        if self.count == self.capacity and not self._thin(step):
            self.dropped += 1
            return -1
        i = self.count
        self._step[i], self._kind[i], self._index[i] = step, code, index
        self._bytes[i], self._t_post[i] = nbytes, t_post
        self._t_done[i], self._wait[i] = t_done, wait_s
        self.count = i + 1
        if key is not None:
            self._pending[key] = i
        return i

    def complete(self, key: int, t_done: float, wait_s: float = 0.0) -> None:
        """The request ``key`` was seen complete at ``t_done`` after blocking ``wait_s``."""
        i = self._pending.pop(key, -1)
        if i >= 0:
            self._t_done[i] = t_done
            self._wait[i] += wait_s

    def is_pending(self, key: int) -> bool:
        """Whether request ``key`` is kept and not completed yet."""
        return key in self._pending

    def _thin(self, step: int) -> bool:
        """Double the stride and compact in place until a slot is free; False if none
        frees (one kept step fills the buffer)."""
        while self.count == self.capacity:
            steps = self._step[: self.count]
            if steps.min() == steps.max():
                return False  # one step fills the buffer: the new event goes
            stride = self.stride * 2
            keep = steps % stride == 0
            kept = int(np.count_nonzero(keep))
            slots = np.cumsum(keep) - 1
            for col in self._cols.values():
                col[:kept] = col[: self.count][keep]
            self._pending = {key: int(slots[i]) for key, i in self._pending.items() if keep[i]}
            self.dropped += self.count - kept
            self.count, self.stride = kept, stride
            if step % stride:
                return False  # the current step is no longer sampled
        return True

    def columns(self) -> dict[str, np.ndarray]:
        """The kept events (copies), in post order."""
        return {name: col[: self.count].copy() for name, col in self._cols.items()}

    def attrs(self) -> dict[str, int]:
        """What the columns hold (``schema.EVENT_ATTRS``; the kind names are added on write)."""
        return {"capacity": self.capacity, "stride": self.stride, "recorded": self.recorded,
                "dropped": self.dropped}


def on_run_clock(times: np.ndarray, t0: float, drift: Callable[[np.ndarray], np.ndarray]
                 ) -> np.ndarray:
    """``time.monotonic`` readings as seconds on the run's clock: minus this rank's time 0
    and the drift of its offset since the start (as the step rows' ``t_start``)."""
    times = np.asarray(times, dtype=np.float64)
    return times - t0 - drift(times)
