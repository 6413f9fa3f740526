"""bench/files.py: whole-or-nothing writes under unpredictable names, and the flock that
keeps two processes off one path.

Split off this module: ``tests/e2e/test_files_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import os

import pytest

from syncbench.bench.files import ExclusiveLock, LockHeld, WriteError, write_atomic


def test_write_atomic_replaces_whole_with_mode(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    write_atomic(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_does_not_follow_a_planted_temporary_name(tmp_path):
    """The old fixed name ``.NAME.tmp.<pid>`` could be planted as a symlink; now no
    predictable name is opened, and the file the link points at is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out"
    os.symlink(victim, tmp_path / f".out.tmp.{os.getpid()}")
    write_atomic(target, b"data")
    assert victim.read_text() == "keep"
    assert target.read_bytes() == b"data" and not target.is_symlink()


def test_write_atomic_failure_leaves_nothing_and_the_old_version(tmp_path):
    target = tmp_path / "sub" / "file"
    with pytest.raises(WriteError) as info:
        write_atomic(target, b"x")  # the folder does not exist
    assert str(info.value).startswith(f"cannot write {target}:")
    target.parent.mkdir()
    target.write_text("old")
    os.mkdir(tmp_path / "sub" / "blocker")
    with pytest.raises(WriteError):
        write_atomic(tmp_path / "sub" / "blocker", b"x")  # rename over a folder fails
    assert sorted(p.name for p in target.parent.iterdir()) == ["blocker", "file"]
    assert target.read_text() == "old"


def test_lock_released_is_taken_again_and_refuses_symlinks(tmp_path):
    path = tmp_path / "a.lock"
    first = ExclusiveLock(path, "a").acquire()
    first.release()
    first.release()  # idempotent
    with ExclusiveLock(path, "a"):
        with pytest.raises(LockHeld):
            ExclusiveLock(path, "a").acquire()
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(OSError):
        ExclusiveLock(path, "a").acquire()
    assert not (tmp_path / "elsewhere").exists()
