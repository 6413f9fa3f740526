"""A process by its identity, and a signal that reaches only that process.

A PID is reused once its process ends, so a PID read from a pid file, or recorded
when a run started, may name another process by the time it is signalled. A
process is therefore named by its PID, its command name and its start time (clock
ticks after boot, ``/proc/PID/stat`` field 22, proc(5)), which a later process with
the same PID does not share. :func:`signal_if_same` opens a pidfd first
(pidfd_open(2), Linux 5.3), checks the identity, then signals through the pidfd:
the check and the signal see the same process. Where the kernel has no pidfds it
checks, then signals by PID.

The hang guard kills its node's PRRTE daemon this way (``bench/mpi/watchdog.py``);
the local Slurm cluster stops the daemons it started (``bench/cluster/slurm.py``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass


def stat_fields(pid: int) -> tuple[str, list[str]]:
    """``comm`` and the fields after it in ``/proc/PID/stat`` (comm may hold spaces and
    parentheses); the fields start at ``state`` (field 3 of proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()


@dataclass(frozen=True)
class Process:
    """A process as the kernel knows it: its PID, name and start time."""

    pid: int
    comm: str
    start: int

    @classmethod
    def of(cls, pid: int, live: bool = False) -> Process | None:
        """The process with this PID now; None if there is none or it cannot be read, and
        with ``live``, also if it has ended and waits to be reaped (a zombie)."""
        try:
            comm, fields = stat_fields(pid)
            if live and fields[0] in ("Z", "X"):
                return None
            return cls(pid, comm, int(fields[19]))
        except (OSError, ValueError, IndexError):
            return None

    def still_there(self, live: bool = False) -> bool:
        """Whether ``pid`` still names this very process (same name, same start time)."""
        return Process.of(self.pid, live) == self


def signal_if_same(process: Process, sig: int, live: bool = False) -> bool:
    """Send ``sig`` to ``process`` if its PID still names it (:meth:`Process.still_there`
    with ``live``); whether it was sent. A process that is gone, or a PID another
    process now has, gets nothing."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds here: the check, then the signal by PID
        if not process.still_there(live):
            return False
        try:
            os.kill(process.pid, sig)
        except OSError:
            return False
        return True
    try:
        if not process.still_there(live):  # the pidfd's process: it had the PID all along
            return False
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True
