"""``--resume`` refuses a checkpoint of another run (model, strategy, world size, sample
budget, batch size, dataset, seed) in setup: one line naming what differs, status 2."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import run_mpi, train_config

from syncbench.bench.train.checkpoint import (
    IDENTITY,
    commit_checkpoint,
    latest_checkpoint,
    run_identity,
)

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--batch-size", "16",
         "--progress", "never", "--eval-every", "0"]
RUN = [*SMALL, "--epochs", "2", "--checkpoint-every", "20"]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """The parts folder of a 2-rank run that checkpointed at step 40, then crashed."""
    folder = tmp_path_factory.mktemp("crashed")
    out = folder / "run.h5"
    proc = run_mpi(2, "train", *RUN, "--inject-fault", "1:50", "--out", str(out), timeout=120)
    assert proc.returncode != 0 and not out.exists(), proc.stderr[-2000:]
    info = json.loads((folder / "run.h5.parts" / "checkpoint.json").read_text())
    assert info["model"] == "mlp" and info["total_samples"] == 4096, info
    return folder


def _copy(crashed, tmp_path):
    shutil.copytree(crashed / "run.h5.parts", tmp_path / "run.h5.parts")
    return tmp_path / "run.h5"


@pytest.mark.parametrize(("np_", "flags", "needle"), [
    (2, ["--model", "mlp:32"], "is for model mlp, this run is mlp:32"),
    (2, ["--epochs", "3"], "is for sample budget 4096, this run is 6144"),
    (2, ["--algorithm", "localsgd"], "is for strategy ssgd, this run is localsgd"),
    (1, [], "is for 2 ranks, this job has 1"),
])
def test_resume_with_another_run_is_one_line(crashed, tmp_path, np_, flags, needle):
    out = _copy(crashed, tmp_path)
    proc = run_mpi(np_, "train", *RUN, *flags, "--out", str(out), "--resume", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncbench")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith(f"syncbench train: error: --resume: the checkpoint in "
                               f"{out}.parts {needle}"), lines[0]
    assert (tmp_path / "run.h5.parts" / "checkpoint.json").exists()  # nothing discarded


def test_resume_of_the_same_run_goes_on(crashed, tmp_path):
    out = _copy(crashed, tmp_path)
    proc = run_mpi(2, "train", *RUN, "--out", str(out), "--resume", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.exists()


@pytest.mark.parametrize("key", sorted(IDENTITY))
def test_every_identity_key_is_checked(tmp_path, key):
    config = train_config("--dataset", "synthetic", "--out", str(tmp_path / "r.h5"))
    mine = run_identity(config, 2, 4096)
    theirs = {**mine, key: "other" if isinstance(mine[key], str) else mine[key] + 1}
    commit_checkpoint(tmp_path, 7, theirs["world_size"], theirs)
    assert latest_checkpoint(tmp_path, theirs["world_size"], theirs) == 7
    with pytest.raises(ValueError) as raised:
        latest_checkpoint(tmp_path, mine["world_size"], mine)
    label = "ranks" if key == "world_size" else IDENTITY[key]
    assert label in str(raised.value) and str(mine[key]) in str(raised.value)


def test_a_checkpoint_without_identity_checks_the_world_size_only(tmp_path):
    (tmp_path / "checkpoint.json").write_text(json.dumps({"step": 5, "world_size": 2}))
    config = train_config("--dataset", "synthetic", "--model", "lenet")
    assert latest_checkpoint(tmp_path, 2, run_identity(config, 2, 1)) == 5


def test_a_resume_with_another_quantize_codec_is_refused(tmp_path):
    int8 = train_config("--algorithm", "diloco", "--quantize", "int8")
    fp16 = train_config("--algorithm", "diloco", "--quantize", "fp16")
    commit_checkpoint(tmp_path, 6, 2, run_identity(int8, 2, 4096))
    assert latest_checkpoint(tmp_path, 2, run_identity(int8, 2, 4096)) == 6
    with pytest.raises(ValueError) as err:
        latest_checkpoint(tmp_path, 2, run_identity(fp16, 2, 4096))
    assert "--quantize" in str(err.value) and "int8" in str(err.value)
    assert "fp16" in str(err.value) and "\n" not in str(err.value)
