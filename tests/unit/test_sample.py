"""``syncbench sample`` and what ``--save-model`` writes: the saved parameters round-trip
exactly with a record of their model and tokens, greedy text is the argmax of the model's
own logits, sampled text is fixed by its seed, and every bad input is one line and status
2. The models are built in-process (no training launch) on the committed Tempest excerpt.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from syncbench.bench import cli
from syncbench.bench.data import text
from syncbench.bench.data.dataset import Dataset
from syncbench.bench.train import sampling, saved_model
from syncbench.kernels.gpt import GPT, GPTSpec
from syncbench.kernels.zoo import build_model

#: The opening of The Tempest (``tempest_gut.txt`` of the archive), public domain.
SAMPLE = (Path(__file__).parents[1] / "data" / "tempest_opening.txt").read_bytes()
SPEC = GPTSpec(d=8, layers=1, heads=2, ctx=8)


def corpus() -> text.TextDataset:
    """The excerpt as a corpus: the first 4000 bytes train, the rest held out."""
    return text.corpus({"scene_a": SAMPLE[:4000], "scene_b": SAMPLE[4000:]}, ("scene_b",),
                       "sample", "committed", ctx=SPEC.ctx)


def tiny_gpt(dtype=np.float64, scale: float = 0.1) -> GPT:
    """A hand-built tiny ``gpt``: its parameters drawn N(0, ``scale``), large enough that
    its greedy text is not one byte repeated (a freshly initialised model's is)."""
    model = GPT(SPEC, text.VOCAB, dtype=dtype, seed=4)
    model.params[...] = np.random.default_rng(2).normal(0.0, scale, model.params.size)
    return model


def save_gpt(tmp_path: Path, model: GPT, name: str = "lm.npy") -> Path:
    path = tmp_path / name
    saved_model.save(path, model.params, saved_model.describe(str(SPEC), corpus()))
    return path


def sample(capsys, *argv: str) -> tuple[int, str, str]:
    """``syncbench sample ARGV`` in this process: (status, stdout, stderr)."""
    try:
        status = cli.main(["sample", *argv])
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_saved_model_round_trips_its_parameters_exactly(tmp_path, dtype):
    model = tiny_gpt(dtype)
    path = save_gpt(tmp_path, model)
    bare = np.load(path)  # the .npy is the bare parameters, as before the record
    assert bare.dtype == dtype and bare.tobytes() == model.params.tobytes()
    saved = saved_model.load(path)
    assert saved.params.dtype == dtype and saved.params.tobytes() == model.params.tobytes()
    assert (saved.model, saved.dataset, saved.tokens, saved.vocab) == (
        "gpt:d=8,layers=1,heads=2,ctx=8", "sample", "bytes", 256)
    assert bytes(saved.alphabet) == bytes(sorted(set(SAMPLE[:4000])))
    rebuilt = sampling.language_model(saved, str(path))
    assert rebuilt.params.dtype == dtype
    assert rebuilt.params.tobytes() == model.params.tobytes()
    record = json.loads(saved_model.record_path(path).read_text())
    assert record["params"] == model.params.size and record["dtype"] == np.dtype(dtype).name


def test_the_record_spells_out_every_size_and_an_image_model_has_no_tokens(tmp_path):
    assert saved_model.describe("gpt", corpus())["model"] == "gpt:d=128,layers=4,heads=4,ctx=64"
    images = Dataset("tiny", np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64),
                     np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64), 3, "generated")
    record = saved_model.describe("mlp:5", images)
    assert record == {"format": saved_model.FORMAT, "model": "mlp:5", "dataset": "tiny"}
    mlp = build_model("mlp:5", images.input_shape, 3, dtype=np.float64)
    saved_model.save(tmp_path / "mlp.npy", mlp.params, record)
    saved = saved_model.load(tmp_path / "mlp.npy")
    assert saved.model == "mlp:5" and saved.vocab is None and saved.alphabet is None
    assert saved.params.tobytes() == mlp.params.tobytes()


def test_greedy_text_is_the_argmax_of_the_models_own_logits(tmp_path, capsys):
    model = tiny_gpt()
    path = save_gpt(tmp_path, model)
    prompt, count = b"the ", 12  # runs past ctx (8): the model sees the last 8 bytes
    status, out, err = sample(capsys, str(path), "--prompt", prompt.decode(), "--tokens",
                              str(count), "--greedy")
    assert status == 0 and err == "", err
    expected = list(prompt)
    for _ in range(count):
        logits = model.forward(np.array([expected[-SPEC.ctx:]]), train=False)[0, -1]
        expected.append(int(np.argmax(logits)))
    assert out == sampling.show(bytes(expected)) + "\n"
    assert len(set(expected[len(prompt):])) > 1, "the model repeats one byte"
    # one forward over the first ctx bytes: every position's argmax is the next byte
    logits = model.forward(np.array([expected[:SPEC.ctx]]), train=False)[0]
    assert list(np.argmax(logits, axis=-1)[len(prompt) - 1:-1]) == expected[len(prompt):SPEC.ctx]
    assert sample(capsys, str(path), "--prompt", "the ", "--tokens", str(count),
                  "--temperature", "0")[1] == out


def test_sampled_text_is_fixed_by_its_seed(tmp_path, capsys):
    model = tiny_gpt()
    path = save_gpt(tmp_path, model)
    args = (str(path), "--prompt", "Boatswain", "--tokens", "40", "--temperature", "1.5")
    first = sample(capsys, *args, "--seed", "3")
    assert first[0] == 0 and first[1].startswith("Boatswain") and first[2] == ""
    assert sample(capsys, *args, "--seed", "3") == first
    other = sample(capsys, *args, "--seed", "4")
    assert other[0] == 0 and other[1] != first[1]
    drawn = model.generate(b"Boatswain", 40, 1.5, np.random.default_rng(3))
    assert first[1] == sampling.show(b"Boatswain" + drawn) + "\n"
    greedy = sample(capsys, str(path), "--prompt", "Boatswain", "--tokens", "40", "--greedy")
    assert greedy[1] != first[1]


def test_a_bare_npy_is_read_when_its_model_is_named(tmp_path, capsys):
    model = tiny_gpt()
    path = tmp_path / "old.npy"
    np.save(path, model.params)  # as --save-model wrote before the record
    status, out, err = sample(capsys, str(path), "--model", "gpt:d=8,layers=1,heads=2,ctx=8",
                              "--tokens", "5", "--greedy", "--prompt", "\u00e9")
    assert status == 0 and err == ""  # no record: every byte value is in the vocabulary
    expected = model.generate("\u00e9".encode(), 5)
    assert out == sampling.show("\u00e9".encode() + expected) + "\n"


def write_mlp(path: Path) -> None:
    images = Dataset("tiny", np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64),
                     np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64), 3, "generated")
    mlp = build_model("mlp:5", images.input_shape, 3)
    saved_model.save(path, mlp.params, saved_model.describe("mlp:5", images))


BAD = [
    ("missing file", ["{dir}/nothing.npy"], "no such file"),
    ("a folder", ["{dir}"], "is a folder"),
    ("not a .npy", ["{dir}/lm.npy.json"], "not a whole .npy file"),
    ("not a gpt", ["{dir}/mlp.npy"], "is a mlp:5 model, not a language model"),
    ("unseen character", ["{dir}/lm.npy", "--prompt", "a#b"], "'#' is outside the model's "
     "vocabulary (the 59 characters of its training text)"),
    ("non-ASCII prompt", ["{dir}/lm.npy", "--prompt", "caf\u00e9"], "'\u00e9' is outside"),
    ("zero tokens", ["{dir}/lm.npy", "--tokens", "0"], "argument --tokens"),
    ("negative temperature", ["{dir}/lm.npy", "--temperature", "-0.5"], "argument --temperature"),
    ("NaN temperature", ["{dir}/lm.npy", "--temperature", "nan"], "argument --temperature"),
    ("negative seed", ["{dir}/lm.npy", "--seed", "-1"], "argument --seed"),
    ("not a gpt spec", ["{dir}/lm.npy", "--model", "mlp"], "expected a language model"),
    ("another model named", ["{dir}/lm.npy", "--model", "gpt:d=16"],
     "lm.npy is gpt:d=8,layers=1,heads=2,ctx=8"),
    ("bare, unnamed", ["{dir}/bare.npy"], "name it with --model"),
    ("bare, wrong size", ["{dir}/bare.npy", "--model", "gpt:d=16,heads=2"],
     "are not a gpt:d=16,layers=4,heads=2,ctx=64 model's"),
    ("stale record", ["{dir}/swapped.npy"], "describes other parameters"),
    ("bad record", ["{dir}/junk.npy"], "not a saved model's record"),
]


@pytest.mark.parametrize(("argv", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, words):
    model = tiny_gpt()
    path = save_gpt(tmp_path, model)
    np.save(tmp_path / "bare.npy", model.params)
    write_mlp(tmp_path / "mlp.npy")
    np.save(tmp_path / "swapped.npy", model.params + 1)  # another array under lm's record
    saved_model.record_path(tmp_path / "swapped.npy").write_bytes(
        saved_model.record_path(path).read_bytes())
    np.save(tmp_path / "junk.npy", model.params)
    saved_model.record_path(tmp_path / "junk.npy").write_text("{\"model\": 3}\n")
    status, out, err = sample(capsys, *[a.format(dir=tmp_path) for a in argv])
    assert status == 2 and out == ""
    assert err.startswith("syncbench sample: error: ") and err.count("\n") == 1, err
    assert words in err and "Traceback" not in err, err
