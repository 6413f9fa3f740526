"""``syncbench speed --compress``'s timing (bench/micro/codecs.py): each codec call is made
at once after a step, on the gradient that step wrote, and a plain copy is timed so."""

from __future__ import annotations

import numpy as np

from syncbench.bench.micro.codecs import after_each_step, step_shares


def test_each_call_follows_its_own_step_and_both_means_are_per_step():
    order = []
    stepping, calling = after_each_step(lambda: order.append("step"),
                                        lambda: order.append("call"), 3)
    assert order == ["step", "call"] * 3
    assert stepping > 0 and calling > 0


def test_the_codec_sees_the_gradient_its_step_just_wrote(monkeypatch):
    """A codec timed after a block of steps would see only the last step's gradient;
    here every encode reads the one written by the step before it."""
    import syncbench.bench.micro.codecs as codecs

    seen, written = [], []
    real_calls = codecs._calls

    def spying_calls(spec, x, shapes=None):
        encode, decode, wire = real_calls(spec, x, shapes)
        return (lambda: (seen.append(float(x[0])), encode())[1]), decode, wire

    from syncbench.bench.micro import speed
    real_model = speed.timed_model

    def counting_model(*args, **kwargs):
        model, inputs, targets = real_model(*args, **kwargs)
        step = model.loss_and_grad

        def marked_step(a, b):
            result = step(a, b)
            model.grads[0] = len(written)  # this step's mark in its gradient
            written.append(len(written))
            return result

        model.loss_and_grad = marked_step
        return model, inputs, targets

    monkeypatch.setattr(codecs, "_calls", spying_calls)
    monkeypatch.setattr(speed, "timed_model", counting_model)
    (row,) = step_shares(["mlp"], ["int8"], batch=4, steps=2, repeats=2)
    # two untimed steps, one untimed encode; then per repeat two coded steps, two copied
    assert seen[1:] == [2.0, 3.0, 6.0, 7.0]
    assert len(row.compute) == len(row.codec) == len(row.copy) == 2
    assert all(s > 0 for s in row.shares + row.copy_shares)
    assert row.gradient_bytes == np.float32().nbytes * 235146
