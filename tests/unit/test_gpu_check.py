"""``jobs/gpu_check.sh``: the budget first, a plan that fits it, independent steps, and
at most 8 files back (the full log one of them), tested on the CPU.

The check itself (``jobs/gpu_check.py``) is loaded from its file. Its measuring runs are
parsed with the command line they are for (no bad flag waits for the GPU machine to be
found), OD-SGD's run takes delayed steps, a failed or timed-out step does not stop the
next one, and the setup builds its venv over an existing environment without a
package index.

Split off this module: ``tests/e2e/test_gpu_check_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from helpers import train_config

from syncbench.algorithms.base import steps_per_rank
from syncbench.bench.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")


def _check(tmp_path, **kw):
    config = gpu_check.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "w"),
                                          venv=str(tmp_path / "venv"),
                                          wheels=str(tmp_path / "wheels"),
                                          budget=gpu_check.BUDGET_S, **kw)
    check = gpu_check.Check(config)
    check.mpiexec = "/venv/bin/mpiexec"
    return check


def _train_config(cmd: list[str]):
    """The namespace ``syncbench train`` parses from a planned command."""
    at = cmd.index("syncbench")
    assert cmd[at + 1] == "train"
    return train_config(*cmd[at + 2:]), int(cmd[cmd.index("-n") + 1])


def test_odsgd_runs_take_delayed_steps(tmp_path):
    """Its warm-up is much shorter than the run: most steps are OD-SGD's delayed ones."""
    check = _check(tmp_path)
    runs = [(label, cmd) for label, cmd in gpu_check.strategy_commands(check)
            if label.startswith("odsgd")]
    assert len(runs) == len(gpu_check.STRATEGY_RANKS)
    for _, cmd in runs:
        config, ranks = _train_config(cmd)
        steps = steps_per_rank(config.epochs, config.synthetic_samples, ranks,
                               config.batch_size)
        assert config.algorithm == "odsgd" and config.warmup_steps == gpu_check.ODSGD_WARMUP
        assert steps >= 4 * config.warmup_steps, (steps, config.warmup_steps)
    assert gpu_check.odsgd_steps() > gpu_check.ODSGD_WARMUP


def test_every_planned_run_parses_with_its_command_line(tmp_path):
    check = _check(tmp_path)
    seen = set()
    for label, cmd in (gpu_check.strategy_commands(check)
                       + gpu_check.throughput_commands(check, True)
                       + gpu_check.throughput_commands(check, False)):
        config, ranks = _train_config(cmd)
        seen.add((config.algorithm, config.model, config.device, ranks))
        assert config.out.startswith(str(check.work)), label
    assert {(a, "lenet", "gpu", n) for a in gpu_check.STRATEGIES
            for n in gpu_check.STRATEGY_RANKS} <= seen
    assert {(m, d) for a, m, d, n in seen if a == "ssgd" and n == 1} >= {
        (m, d) for m, _, _ in gpu_check.THROUGHPUT_MODELS for d in ("gpu", "cpu")}
    assert "resnet8" in {m for m, _, _ in gpu_check.THROUGHPUT_MODELS}  # BatchNorm
    check.gpu, check.cuda_aware = True, True
    runs = gpu_check.comm_runs(check)
    assert ("device staged iallreduce", "iallreduce", "cupy", "no") in runs
    assert any(aware == "yes" for *_, aware in runs)
    parser = build_parser("comm")
    for _, op, buffer, aware in runs:
        args = parser.parse_args(["comm", "--op", op, "--buffer", buffer,
                                  gpu_check.cuda_aware_flag(aware)])
        assert args.buffer == buffer and args.cuda_aware == aware
    check.cuda_aware = False
    assert all(aware == "no" for *_, aware in gpu_check.comm_runs(check))
    check.gpu = False
    assert [b for _, _, b, _ in gpu_check.comm_runs(check)] == ["numpy"]


def test_default_work_folder_is_private_unpredictable_and_removed(tmp_path, monkeypatch):
    """Without --work the scratch is a new folder of mkdtemp's (mode 0700, a random name,
    not ``syncbench-gpu-check-<pid>`` that another user could make first), removed at the
    end; the run files it held come back archived in --out."""
    seen: list[tuple[Path, int, bool]] = []

    def records(check, step):
        seen.append((check.work, check.work.stat().st_mode & 0o777,
                     check.work.stat().st_uid == os.getuid()))
        (check.work / "train-x.h5").write_bytes(b"run")

    monkeypatch.setattr(gpu_check, "plan", lambda with_bodies=True: [
        gpu_check.Step("probe", 5, False, "records the folder", records)])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(gpu_check.tempfile, "tempdir", str(scratch))
    planted = scratch / f"syncbench-gpu-check-{os.getpid()}"
    planted.mkdir(mode=0o777)
    out = tmp_path / "out"
    gpu_check.main(["--out", str(out), "--venv", str(tmp_path / "venv"), "--wheels",
                    str(tmp_path / "wheels"), "--allow-no-gpu"])
    [(work, mode, mine)] = seen
    assert work.parent == scratch and work != planted and mode == 0o700 and mine
    assert work.name.startswith("syncbench-gpu-check-") and not work.exists()
    assert list(scratch.iterdir()) == [planted] and not any(planted.iterdir())
    assert (out / "runs.tar.gz").is_file()


def test_probe_output_parsers():
    out = "noise\nGPUCHECK-JSON {\"ok\": true}\nGPUCHECK-JSON {\"ok\": false, \"x\": 1}\n"
    assert gpu_check.parse_json_line(out) == {"ok": False, "x": 1}
    assert gpu_check.parse_json_line("nothing") == {}
    assert gpu_check.pytest_summary("....\n===== 3 passed, 1 skipped in 2.10s =====\n") == \
        "3 passed, 1 skipped in 2.10s"
    assert gpu_check.shown(["python", "-c", "import x\nprint(1)"]) == \
        "python -c '<script: import x...>'"
