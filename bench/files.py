"""Files every room writes: whole or not at all, under unpredictable names, and locks.

``write_atomic`` writes to a temporary file that ``mkstemp`` creates beside the
target (``O_CREAT|O_EXCL``: a name nobody could predict or plant a symlink at),
syncs it, renames it over the target (atomic on POSIX, rename(2)) and syncs
the folder, so the rename itself survives a power loss (fsync(2): "calling
fsync() on the file does not necessarily ensure that the entry in the
directory containing the file has also reached disk"). On any error the
temporary file is removed and the previous version stays.

``ExclusiveLock`` is an ``flock(2)`` lock on a file beside what it guards: the
kernel releases it when its holder dies (no stale locks after a crash or a
``kill -9``), and the file names its holder (host, pid, command), so the
process that is refused can say who holds it in one line. The lock file is
opened with ``O_NOFOLLOW`` and removed by its holder on release; a process
that locked a file that was meanwhile removed or replaced tries again.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import fcntl
import os
import socket
import sys
import tempfile
from pathlib import Path


class WriteError(OSError):
    """A file could not be written; ``str()`` is one line naming the path and the cause."""

    def __init__(self, path: str | os.PathLike, cause: OSError) -> None:
        code = cause.errno or 0
        reason = (cause.strerror or os.strerror(code)) if code else (str(cause) or "write failed")
        super().__init__(code, reason, str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        suffix = f" (errno {self.errno})" if self.errno else ""
        return f"cannot write {self.path}: {self.strerror}{suffix}"


def fsync_dir(folder: str | os.PathLike) -> None:
    """Sync a folder's entries (a rename or a new file in it) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems refuse fsync on a folder: nothing to sync
        if exc.errno not in (errno_codes.EINVAL, errno_codes.ENOTSUP, errno_codes.EBADF):
            raise
    finally:
        os.close(fd)


def write_atomic(final: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``final`` whole or not at all (module docstring), with ``mode``.

    Raises :class:`WriteError` naming ``final`` and leaves no temporary file."""
    final = Path(final)
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            tmp = None
            fsync_dir(final.parent)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    except OSError as exc:
        raise WriteError(final, exc) from None


class LockHeld(RuntimeError):
    """Another process holds an :class:`ExclusiveLock`; ``str()`` is one line naming it."""

    def __init__(self, what: str, lock_path: Path, holder: str) -> None:
        self.what, self.lock_path, self.holder = what, lock_path, holder
        super().__init__(f"{what} is in use by another process ({holder or 'holder unknown'}; "
                         f"lock {lock_path})")


def _holder_line() -> str:
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":  # python -m syncbench
        program = "syncbench"
    command = " ".join([program, *sys.argv[1:6]])
    return f"host {socket.gethostname()} pid {os.getpid()}: {command}".strip()


class ExclusiveLock:
    """An exclusive, non-blocking ``flock`` on ``lock_path`` (module docstring).

    ``acquire()`` raises :class:`LockHeld` at once when another process holds it, and
    ``OSError`` when the lock file cannot be made. Use as a context manager or call
    ``release()``; both are idempotent."""

    def __init__(self, lock_path: str | os.PathLike, what: str) -> None:
        self.path = Path(lock_path)
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> ExclusiveLock:
        if self._fd is not None:
            return self
        for _ in range(20):  # a holder that releases removes the file: open it anew
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
                os.close(fd)
                raise LockHeld(self.what, self.path, holder) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # locked a file its holder removed meanwhile
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, (_holder_line() + "\n").encode(), 0)
            self._fd = fd
            return self
        raise OSError(errno_codes.EAGAIN, "lock file keeps being replaced", str(self.path))

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: the next holder opens a new file
        os.close(fd)

    def __enter__(self) -> ExclusiveLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
