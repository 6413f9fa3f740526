"""``--lr-schedule`` and ``--lr-warmup``: the factor's definition, the optimizers under
it (against a step-by-step re-computation with explicit rates, and against PyTorch's
``LinearLR`` and ``CosineAnnealingLR`` where PyTorch is installed), the count through a
checkpoint, and the flags' bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import train_config

from syncbench.algorithms.adamw import AdamW
from syncbench.algorithms.local_optimizer import build_local_optimizer
from syncbench.algorithms.lr_schedule import COSINE_FLOOR, LRSchedule
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import ALGORITHMS
from syncbench.bench.train.config import check_train_config
from syncbench.kernels.zoo import build_model


def test_constant_is_exactly_one_and_warmup_is_linear():
    constant = LRSchedule("constant", 0, 100)
    assert all(constant.factor(s) == 1.0 for s in range(1, 200))
    warm = LRSchedule("constant", 4, 100)
    assert [warm.factor(s) for s in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_falls_from_one_to_the_floor_at_the_last_step():
    s = LRSchedule("cosine", 10, 110)
    assert s.factor(10) == s.factor(11) == 1.0  # the warm-up's end, then the peak
    assert s.factor(111) == pytest.approx(COSINE_FLOOR, abs=1e-15)
    assert s.factor(61) == pytest.approx(COSINE_FLOOR + (1 - COSINE_FLOOR) / 2)
    assert COSINE_FLOOR < s.factor(110) < COSINE_FLOOR + 1e-3  # the last step: nearly there
    values = [s.factor(k) for k in range(10, 112)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # never rises after warm-up
    assert s.factor(500) == pytest.approx(COSINE_FLOOR)  # past the budget: the floor


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_scheduled_optimizer_equals_explicit_rates_step_by_step(kind):
    rng = np.random.default_rng(0)
    start = rng.standard_normal(50)
    grads = [rng.standard_normal(50) for _ in range(30)]
    schedule = LRSchedule("cosine", 5, 30)

    def make(sched):
        if kind == "adamw":
            return AdamW(start * 0, 0.01, 0.1, (0.9, 0.99), 1e-8, schedule=sched)
        return MomentumSGD(start * 0, 0.01, 0.9, 0.1, schedule=sched)

    scheduled, explicit = make(schedule), make(None)
    a, b = start.copy(), start.copy()
    for step, g in enumerate(grads, 1):
        scheduled.step(a, g)
        explicit.step(b, g, lr=0.01 * schedule.factor(step))
    np.testing.assert_array_equal(a, b)


def test_the_count_goes_through_a_checkpoint():
    like = np.zeros(8)
    opt = AdamW(like, 0.01, 0.0, (0.9, 0.999), 1e-8, schedule=LRSchedule("cosine", 2, 20))
    params = np.ones(8)
    for _ in range(7):
        opt.step(params, np.full(8, 0.5))
    opt.reset_moments()  # --momentum-sync zero restarts Adam's bias correction, not the schedule
    state = opt.state()
    again = AdamW(like, 0.01, 0.0, (0.9, 0.999), 1e-8, schedule=LRSchedule("cosine", 2, 20))
    again.load_state(state, np.asarray)
    assert state["lr_schedule_steps"] == again.clock.steps == 7
    assert again.clock.next_lr() == pytest.approx(0.01 * LRSchedule("cosine", 2, 20).factor(8))


def test_the_flags_build_the_schedule_over_the_budget():
    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float64, seed=0)
    config = train_config("--optimizer", "adamw", "--lr-schedule", "cosine", "--lr-warmup", "3")
    opt = build_local_optimizer(model, config, ALGORITHMS["ssgd"].traits, total_steps=40)
    assert opt.clock.schedule == LRSchedule("cosine", 3, 40)
    plain = build_local_optimizer(model, train_config(), ALGORITHMS["ssgd"].traits, 40)
    assert plain.clock.schedule == LRSchedule("constant", 0, 40)


def test_adamw_under_warmup_and_cosine_matches_torchs_schedulers_in_float64():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    rng = np.random.default_rng(3)
    start = rng.standard_normal(64)
    grads = [rng.standard_normal(64) for _ in range(60)]
    warmup, total, lr = 8, 60, 0.02
    ours = AdamW(start * 0, lr, 0.1, (0.9, 0.99), 1e-8,
                 schedule=LRSchedule("cosine", warmup, total))
    params = start.copy()
    p = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    ref = torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    # ours at step s (1-based) uses factor(s): s / W during the warm-up, then the cosine
    # over the remaining total - W steps down to COSINE_FLOOR
    schedulers = torch.optim.lr_scheduler.SequentialLR(ref, [
        torch.optim.lr_scheduler.LinearLR(ref, 1 / warmup, 1.0, total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(ref, total - warmup, lr * COSINE_FLOOR),
    ], milestones=[warmup])
    for g in grads:
        ours.step(params, g)
        p.grad = torch.tensor(g, dtype=torch.float64)
        ref.step()
        schedulers.step()
    theirs = p.detach().numpy()
    assert np.max(np.abs(params - theirs)) <= 64 * np.finfo(np.float64).eps * np.abs(theirs).max()


@pytest.mark.parametrize("flags, says", [
    (("--lr-warmup", "-1"), "--lr-warmup must be >= 0, got -1"),
    (("--algorithm", "asgd", "--lr-schedule", "cosine"), "asgd cannot --lr-schedule"),
    (("--algorithm", "asgd", "--lr-warmup", "5"), "asgd cannot --lr-schedule"),
])
def test_bad_schedule_flags_are_one_line(flags, says):
    config = train_config(*flags)
    with pytest.raises(ValueError, match=says.replace("-", r"\-")):
        check_train_config(config, 2)


def test_an_unknown_schedule_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        train_config("--lr-schedule", "linear")
    assert "invalid choice: 'linear'" in capsys.readouterr().err
    assert math.isclose(LRSchedule("cosine", 0, 2).factor(3), COSINE_FLOOR)


def test_peek_gives_the_next_steps_rate_without_counting_it():
    opt = AdamW(np.zeros(3), 0.01, 0.0, (0.9, 0.999), 1e-8, schedule=LRSchedule("cosine", 3, 9))
    for _ in range(5):
        ahead = opt.clock.peek_lr()
        assert opt.clock.peek_lr() == ahead  # not counted
        assert opt.clock.next_lr() == ahead
    assert opt.lr == 0.01 and opt.clock.steps == 5
