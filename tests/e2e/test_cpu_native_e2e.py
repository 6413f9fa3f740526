"""The compiled direct convolution (kernels/cpu/conv.c) against float64 references and the
NumPy path: kernels alone, the Conv2d layer, whole models' gradients, the fall-back and
the build cache, which loads no library it cannot trust (one planted by another user).

Split off ``tests/unit/test_cpu_native.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_cpu_native import native

from syncbench.kernels import cpu_native


@native
def test_the_library_is_built_once_into_the_cache_and_can_be_turned_off(tmp_path):
    env = {**os.environ, "SYNCBENCH_CACHE": str(tmp_path)}
    probe = ("from syncbench.kernels import cpu_native as c; print(c.status()); "
             "import glob; print(len(glob.glob(str(c.cache_dir() / '*.so'))))")
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    assert first[0].startswith("native") and first[1] == "1"
    (built,) = (tmp_path / "cpu-kernels").glob("*.so")
    stamp = built.stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True)
    assert built.stat().st_mtime_ns == stamp
    off = subprocess.run([sys.executable, "-c", probe],
                         env={**env, cpu_native.MODE_VARIABLE: "numpy"},
                         capture_output=True, text=True, check=True).stdout
    assert off.startswith(f"numpy ({cpu_native.MODE_VARIABLE}=numpy)")


# -- the cache loads no library another user could have planted --------------------------
needs_cc = pytest.mark.skipif(cpu_native.compiler() is None, reason="no C compiler")


#: Builds and loads the library of the sources in argv[1] (a stand-in for kernels/cpu, so
#: that these tests run on any core), with the cache of $SYNCBENCH_CACHE.
PROBE = ("import sys; from pathlib import Path; from syncbench.kernels import cpu_native as c; "
         "c.SOURCES = Path(sys.argv[1]); print(c.status())")


LINE = "syncbench: compiled CPU kernels: "


@pytest.fixture
def stand_in(tmp_path):
    """(sources, the cached library's name, a planted library, its marker file): the
    stand-in sources define every kernel the loader declares, as no-ops; so does the
    planted library, whose constructor writes the marker as soon as anything loads it."""
    sources = tmp_path / "src"
    sources.mkdir()
    names = re.findall(r'"(sb_\w+)"', inspect.getsource(cpu_native._declare))
    stubs = "".join(f"void {n}(void) {{}}\n" for n in names)
    (sources / "stub.c").write_text(stubs)
    marker = tmp_path / "MARKER"
    (tmp_path / "planted.c").write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
        + stubs)
    planted = tmp_path / "planted.so"
    subprocess.run([cpu_native.compiler(), "-shared", "-fPIC", "-o", str(planted),
                    str(tmp_path / "planted.c")], check=True)
    # the name the cache gives this library: build it once into a scratch cache
    _probe(sources, tmp_path / "scratch")
    (built,) = (tmp_path / "scratch" / "cpu-kernels").glob("cpu-*.so")
    return sources, built.name, planted, marker


def _probe(sources: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, str(sources)], capture_output=True,
                          text=True, check=True, timeout=120,
                          env={**os.environ, "SYNCBENCH_CACHE": str(cache)})


def _planted_cache(tmp_path, name, planted, folder_mode=0o700, owner=None, file_owner=None,
                   file_mode=0o755, digest="planted", link=False):
    """A cache folder holding ``planted`` under the library's name; ``digest``: the
    recorded SHA-256 ("planted": the planted file's own, "other": another's, None: none)."""
    folder = tmp_path / "cache" / "cpu-kernels"
    folder.mkdir(parents=True)
    target = folder / name
    if link:
        target.symlink_to(planted)
    else:
        shutil.copy(planted, target)
        os.chmod(target, file_mode)
    if digest is not None:
        data = planted.read_bytes() if digest == "planted" else b"another library"
        (folder / f"{name}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    if file_owner is not None:
        os.chown(target, file_owner, file_owner)
        if digest is not None:
            os.chown(folder / f"{name}.sha256", file_owner, file_owner)
    if owner is not None:
        os.chown(folder, owner, owner)
    os.chmod(folder, folder_mode)
    return folder


def _said(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith(LINE)]


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


#: Cache folders nobody else may have written to: a planted library in them fails its own
#: checks and is rebuilt over.
PLANTED_FILES = {
    "no recorded hash": ({"digest": None}, "has no recorded SHA-256"),
    "another library's hash": ({"digest": "other"}, "does not match its recorded SHA-256"),
    "group-writable file": ({"file_mode": 0o775}, "is writable by its group or others"),
    "symbolic link": ({"link": True}, "cannot be opened"),
    "another user's file": ({"file_owner": 65534}, "belongs to uid 65534"),
}


#: Cache folders another user could have written to: not used at all.
UNSAFE_FOLDERS = {
    "world-writable folder": ({"folder_mode": 0o777}, "is writable by its group or others"),
    "group-writable folder": ({"folder_mode": 0o770}, "is writable by its group or others"),
    "another user's folder": ({"owner": 65534, "folder_mode": 0o755}, "belongs to uid 65534"),
}


def _marks(cases):
    return [pytest.param(*case, id=name, marks=[root_only] if "user's" in name else [])
            for name, case in cases.items()]


@needs_cc
@pytest.mark.parametrize("setup, said", _marks(PLANTED_FILES))
def test_a_planted_library_in_the_cache_is_not_loaded_but_rebuilt(tmp_path, stand_in, setup,
                                                                   said):
    sources, name, planted, marker = stand_in
    folder = _planted_cache(tmp_path, name, planted, **setup)
    proc = _probe(sources, tmp_path / "cache")
    assert not marker.exists(), "the planted library was loaded"
    assert proc.stdout.startswith("native (compiled with"), proc.stdout
    [line] = _said(proc)
    assert said in line and str(folder / name) in line and line.endswith("not loaded, rebuilt")
    rebuilt = folder / name
    assert not rebuilt.is_symlink() and rebuilt.stat().st_uid == os.geteuid()
    assert (folder / f"{name}.sha256").read_text().strip() == \
        hashlib.sha256(rebuilt.read_bytes()).hexdigest()
    again = _probe(sources, tmp_path / "cache")  # the rebuilt library is trusted
    assert not _said(again) and not marker.exists()


@needs_cc
@pytest.mark.parametrize("setup, said", _marks(UNSAFE_FOLDERS))
def test_a_cache_folder_others_could_write_to_is_not_used(tmp_path, stand_in, setup, said):
    sources, name, planted, marker = stand_in
    folder = _planted_cache(tmp_path, name, planted, **setup)
    proc = _probe(sources, tmp_path / "cache")
    assert not marker.exists(), "the planted library was loaded"
    [line] = _said(proc)
    assert said in line and str(folder) in line
    assert line.endswith("cache not used, the kernels are built for this process only")
    assert proc.stdout.startswith("native (compiled with") and "not cached" in proc.stdout
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, f"{name}.sha256"])
    assert (folder / name).read_bytes() == planted.read_bytes()  # left as it was


@needs_cc
def test_the_cache_folder_is_private_and_a_built_library_is_loaded_from_it(tmp_path,
                                                                          stand_in):
    sources, name, _, _ = stand_in
    proc = _probe(sources, tmp_path / "cache")
    folder = tmp_path / "cache" / "cpu-kernels"
    assert proc.stdout.startswith("native (compiled with") and not _said(proc)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, f"{name}.sha256"])
    built = folder / name
    stamp = built.stat().st_mtime_ns
    again = _probe(sources, tmp_path / "cache")
    assert again.stdout == proc.stdout and not _said(again)
    assert built.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    # an older cache folder that others may read (made with the umask) becomes 0700
    os.chmod(folder, 0o755)
    _probe(sources, tmp_path / "cache")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_cache_key_changes_with_a_header_the_sources_include(tmp_path):
    """A changed header (kernels/cpu/vector_math.h) must build a new library, not load
    the one compiled from the old text (e2e: the key asks the compiler its version)."""
    src = tmp_path / "a.c"
    src.write_text('#include "h.h"\nint f(void) { return X; }\n')
    header = tmp_path / "h.h"
    header.write_text("#define X 1\n")
    cc = cpu_native.compiler() or "cc"
    before = cpu_native.library_name([src], cc)
    header.write_text("#define X 2\n")
    assert cpu_native.library_name([src], cc) != before
