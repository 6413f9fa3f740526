"""Serial re-computations of the compressing reducers: N ranks' gradients in one process,
reduced with the codecs alone (no MPI), in the order the reducers' collectives fix.

Each function takes the ranks' float32 gradients ``grads[r]`` and returns the mean every
rank applies. Where the reducer's sums are written by hand (the 16-bit and int8
reduce-scatters, top-k's gathered vectors) the sums run in rank order, as the
reducer's, so the result is bit-identical; where MPI's Allreduce sums (PowerSGD's P and
Q, random-k's values) the order is the library's and the oracle sums in rank order.
"""

from __future__ import annotations

import numpy as np

from syncbench.algorithms.codecs.feedback import ErrorFeedback
from syncbench.algorithms.codecs.half import sum_decoded
from syncbench.algorithms.codecs.sparse import RandomK, kept
from syncbench.algorithms.reducers.compressed import mean_scale, segment_bounds


def rank_sum(arrays):
    """Elementwise float32 sum in rank order."""
    total = arrays[0].astype(np.float32, copy=True)
    for a in arrays[1:]:
        total += a
    return total


def half_mean(codec, grads):
    """fp16/bf16: decode-sum of every rank's codes, 1/N, the mean rounded to 16 bits."""
    total = sum_decoded(codec, [codec.encode(g) for g in grads])
    total *= mean_scale(len(grads))
    return codec.decode(codec.encode(total))


def int8_mean(codec, grads):
    """int8: per rank segment, decode-sum of the ranks' codes, 1/N, encode, decode."""
    n, ranks = grads[0].size, len(grads)
    b = segment_bounds(n, ranks)
    out = np.empty(n, dtype=np.float32)
    for i in range(ranks):
        seg = slice(b[i], b[i + 1])
        total = sum_decoded(codec, [codec.encode(g[seg]) for g in grads])
        total *= mean_scale(ranks)
        out[seg] = codec.decode(codec.encode(total))
    return out


class SerialPowerSGD:
    """N PowerSGD states stepped together, P and Q summed over them."""

    def __init__(self, codec, shapes, ranks):
        self.states = [codec.state(shapes) for _ in range(ranks)]

    def mean(self, grads):
        ranks, states = len(grads), self.states
        if not states[0].compressing:
            for s in states:
                s.finish_plain()
            total = rank_sum(grads)
            total *= mean_scale(ranks)
            return total
        ms = [s.prepare(g) for s, g in zip(states, grads)]
        p = rank_sum([s.p_buffer(m) for s, m in zip(states, ms)])
        u = rank_sum([s.uncompressed_buffer(m) for s, m in zip(states, ms)])
        q = rank_sum([s.q_buffer(m, p) for s, m in zip(states, ms)])
        outs = [s.finish(m, q, u, ranks) for s, m in zip(states, ms)]
        return outs[0]


class SerialSparse:
    """top-k / random-k with each rank's error feedback; the step counts calls."""

    def __init__(self, codec, count, ranks):
        self.codec, self.step = codec, 0
        self.feedback = [ErrorFeedback(count) for _ in range(ranks)]

    def mean(self, grads):
        ranks, n = len(grads), grads[0].size
        total = np.zeros(n, dtype=np.float32)
        if self.codec.name == "topk":
            for fb, g in zip(self.feedback, grads):
                acc = fb.compensate(g)
                code = self.codec.encode(acc)
                fb.keep_unsent(acc, code.indices, code.values)
                total[code.indices] += code.values
            total *= mean_scale(ranks)
        else:
            idx = self.codec.indices(n, self.step)
            values = []
            for fb, g in zip(self.feedback, grads):
                acc = fb.compensate(g)
                values.append(acc[idx].astype(np.float32))
                fb.keep_unsent(acc, idx, values[-1])
            total[idx] = rank_sum(values) * mean_scale(ranks)
        self.step += 1
        return total


class SerialDGC:
    """top-k / random-k with DGC's momentum correction on every rank (Lin et al., arXiv
    1712.01887, Algorithm 1), written out in float32 NumPy: ``u = M u + g``,
    ``v = v + u``, send entries of ``v`` (the step's warm-up density), zero ``u`` and
    ``v`` where sent. The step counts calls."""

    def __init__(self, codec, count, ranks):
        self.codec, self.step = codec, 0
        self.momentum = np.float32(codec.options.momentum)
        self.velocity = [np.zeros(count, dtype=np.float32) for _ in range(ranks)]
        self.residual = [np.zeros(count, dtype=np.float32) for _ in range(ranks)]

    def density(self):
        """The warm-up's density of this step: D ** ((s + 1) / 5) in stage s of 4."""
        warmup, density = self.codec.options.warmup, self.codec.density
        if self.step >= warmup:
            return density
        return density ** ((4 * self.step // warmup + 1) / 5)

    def mean(self, grads):
        ranks, n = len(grads), grads[0].size
        k = kept(self.density(), n)
        total = np.zeros(n, dtype=np.float32)
        sent = []
        if self.codec.name == "randomk":
            shared = RandomK(self.density(), self.codec.seed).indices(n, self.step)
        for u, v, g in zip(self.velocity, self.residual, grads):
            u[...] = self.momentum * u + g
            v[...] = v + u
            if self.codec.name == "topk":  # the k largest magnitudes, sorted
                idx = np.sort(np.argpartition(np.abs(v), n - k)[n - k:]) if k < n \
                    else np.arange(n)
            else:
                idx = shared
            assert idx.size == k
            sent.append((idx, v[idx].copy()))
            u[idx] = 0
            v[idx] = 0
        if self.codec.name == "topk":
            for idx, values in sent:
                total[idx] += values
            total *= mean_scale(ranks)
        else:
            idx = sent[0][0]
            total[idx] = rank_sum([values for _, values in sent]) * mean_scale(ranks)
        self.step += 1
        return total
