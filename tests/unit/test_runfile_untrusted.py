"""Run files from anyone: the reader takes nothing from outside the file.

Crafted files, built with h5py from a well-formed one, whose data would come from other
files (external storage, a virtual dataset, an external link, a soft link through one)
or whose shape would fill the memory, are refused with one line naming the dataset,
both by :func:`read_run` and by ``syncbench report`` (exit 2, no traceback), and the
other file's bytes are never printed.

Split off this module: ``tests/e2e/test_runfile_untrusted_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.analysis.collectives import read_events
from syncbench.analysis.runfile import MAX_ELEMENTS, RunFileError, read_run
from syncbench.bench.train.recorder import write_run_file

#: What the other file holds; never to appear in a report.
SECRET = b"FOREIGN-SECRET-0123456789\n"
STEPS = 4


def _rank(steps: int = STEPS) -> dict[str, np.ndarray]:
    cols = {name: np.zeros(steps, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
    cols.update(step=np.arange(steps), t_start=np.arange(steps) * 0.1,
                t_compute=np.full(steps, 0.1), loss=np.linspace(2.0, 1.0, steps),
                samples=np.full(steps, 64))
    return cols


def _run_file(path: Path, layout: str = schema.RANK_LAYOUT_PACKED, events=None) -> Path:
    """A well-formed two-rank run file."""
    root = {"algorithm": "ssgd", "model": "mlp", "dataset": "synthetic", "world_size": 2,
            "config": {"algorithm": "ssgd", "batch_size": 64}, "hostnames": ["n0", "n1"]}
    evals = {"t": np.array([1.0, 2.0]), "step": np.array([2, 4]),
             "samples_seen": np.array([256, 512]), "loss": np.array([1.5, 0.5]),
             "accuracy": np.array([0.5, 0.9])}
    attrs = {r: {"hostname": f"n{r}", "device": "cpu", "slowdown": 1.0} for r in range(2)}
    write_run_file(path, root, {0: _rank(), 1: _rank()}, attrs, evals, 1.0, None,
                   layout=layout, events=events)
    return path


@pytest.fixture
def foreign(tmp_path) -> tuple[Path, Path]:
    """(a text file, an HDF5 file) of someone else's: what a crafted file points at."""
    text = tmp_path / "foreign.txt"
    text.write_bytes(SECRET)
    other = tmp_path / "foreign.h5"
    with h5py.File(other, "w") as f:
        f["accuracy"] = np.array([0.25, 0.75])
        f["hostname"] = np.array([SECRET, SECRET])
        f.create_group("eval")
        for name in schema.EVAL_COLUMNS:
            f["eval"][name] = np.array([7.0, 8.0])
    return text, other


def _replace(f: h5py.File, name: str) -> h5py.Group:
    """Delete ``name`` and return its group, for a crafted replacement."""
    del f[name]
    return f[name.rsplit("/", 1)[0]]


def external_text(f, text, other):
    """/ranks/hostname stored in another file (HDF5 external storage): its bytes."""
    _replace(f, "ranks/hostname").create_dataset(
        "hostname", shape=(2,), dtype=f"S{len(SECRET) // 2}",
        external=[(str(text), 0, len(SECRET))])
    return "/ranks/hostname keeps its data in an external file"


def external_numbers(f, text, other):
    _replace(f, "eval/accuracy").create_dataset(
        "accuracy", shape=(2,), dtype="f8", external=[(str(text), 0, 16)])
    return "/eval/accuracy keeps its data in an external file"


def virtual(f, text, other):
    """/eval/accuracy a virtual dataset over the other HDF5 file's."""
    layout = h5py.VirtualLayout(shape=(2,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(other), "accuracy", shape=(2,))
    _replace(f, "eval/accuracy").create_virtual_dataset("accuracy", layout)
    return "/eval/accuracy is a virtual dataset"


def external_link(f, text, other):
    _replace(f, "ranks/hostname")["hostname"] = h5py.ExternalLink(str(other), "hostname")
    return "/ranks/hostname is a link to another file"


def external_group(f, text, other):
    """A whole group from the other file."""
    del f["eval"]
    f["eval"] = h5py.ExternalLink(str(other), "eval")
    return "/eval is a link to another file"


def soft_link_out(f, text, other):
    """A soft link (inside the file) whose path passes through an external link."""
    f["elsewhere"] = h5py.ExternalLink(str(other), "/")
    _replace(f, "eval/accuracy")["accuracy"] = h5py.SoftLink("/elsewhere/accuracy")
    return "/elsewhere is a link to another file"


def huge_shape(f, text, other):
    """More elements than any run writes, in a few bytes of file (nothing written)."""
    _replace(f, "eval/accuracy").create_dataset("accuracy", shape=(MAX_ELEMENTS + 1,),
                                                dtype="f8", chunks=(1 << 16,))
    return f"/eval/accuracy has shape ({MAX_ELEMENTS + 1},): more than {MAX_ELEMENTS}"


def expanding_shape(f, text, other):
    """Under the bound, but 2 GiB of fill values from no bytes of file."""
    for name in ("t", "step", "samples_seen", "loss", "accuracy"):
        _replace(f, f"eval/{name}").create_dataset(name, shape=(1 << 28,), dtype="f8",
                                                   chunks=(1 << 16,))
    return "/eval/t has shape (268435456,): 2147483648 bytes from 0 in the file"


CRAFTED = [external_text, external_numbers, virtual, external_link, external_group,
           soft_link_out, huge_shape, expanding_shape]


def _crafted(tmp_path, foreign, craft, layout=schema.RANK_LAYOUT_PACKED) -> tuple[Path, str]:
    path = _run_file(tmp_path / f"{craft.__name__}.h5", layout)
    with h5py.File(path, "a") as f:
        said = craft(f, *foreign)
    return path, said


@pytest.mark.parametrize("craft", CRAFTED, ids=lambda c: c.__name__)
def test_read_run_refuses_data_from_outside_the_file(tmp_path, foreign, craft):
    path, said = _crafted(tmp_path, foreign, craft)
    with pytest.raises(RunFileError) as err:
        read_run(path)
    message = str(err.value)
    assert message.startswith(f"{path} is refused: ") and said in message, message
    assert "\n" not in message and SECRET.decode().strip() not in message


def test_the_groups_layout_is_checked_too(tmp_path, foreign):
    """A rank group's column (read by the fast reader when well-formed) from elsewhere."""
    for kind in ("external", "link", "virtual"):
        path = _run_file(tmp_path / f"groups-{kind}.h5", schema.RANK_LAYOUT_GROUPS)
        with h5py.File(path, "a") as f:
            group = _replace(f, "ranks/00001/loss")
            if kind == "external":
                group.create_dataset("loss", shape=(2,), dtype="f8",
                                     external=[(str(foreign[0]), 0, 16)])
            elif kind == "link":
                group["loss"] = h5py.ExternalLink(str(foreign[1]), "accuracy")
            else:
                layout = h5py.VirtualLayout(shape=(2,), dtype="f8")
                layout[:] = h5py.VirtualSource(str(foreign[1]), "accuracy", shape=(2,))
                group.create_virtual_dataset("loss", layout)
        with pytest.raises(RunFileError, match=r"is refused: /ranks/00001/loss "):
            read_run(path)


def test_events_from_another_file_are_refused(tmp_path, foreign):
    """``report``'s collectives table reads /ranks/events: a link out is refused there."""
    columns = {name: np.zeros(2, dtype=dtype) for name, dtype in schema.EVENT_COLUMNS.items()}
    counters = {name: 2 for name in schema.EVENT_COUNT_ATTRS}
    events = {r: (columns, counters) for r in range(2)}
    path = _run_file(tmp_path / "events.h5", events=events)
    assert set(read_events(path)) == {0, 1}
    with h5py.File(path, "a") as f:
        _replace(f, "ranks/events/rows")["rows"] = h5py.ExternalLink(str(foreign[1]),
                                                                      "accuracy")
    read_run(path)  # the run's own columns are untouched
    with pytest.raises(RunFileError, match="is refused: /ranks/events/rows is a link to"):
        read_events(path)


def test_links_and_layouts_inside_the_file_still_read(tmp_path):
    """A soft link within the file, and a chunked (compressed) column, are no way out."""
    path = _run_file(tmp_path / "inside.h5")
    expect = read_run(path)
    with h5py.File(path, "a") as f:
        f.create_group("kept")
        f["kept/accuracy"] = f["eval/accuracy"][()]
        _replace(f, "eval/accuracy")["accuracy"] = h5py.SoftLink("/kept/accuracy")
        loss = f["eval/loss"][()]
        _replace(f, "eval/loss").create_dataset("loss", data=loss, chunks=(1,),
                                                compression="gzip")
    run = read_run(path)
    np.testing.assert_array_equal(run.eval["accuracy"], expect.eval["accuracy"])
    np.testing.assert_array_equal(run.eval["loss"], expect.eval["loss"])
