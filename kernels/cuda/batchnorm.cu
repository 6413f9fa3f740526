// Batch normalization over NCHW activations (references in syncbench.kernels.ops).
//
// Only the passes over the whole activation tensor are kernels; the per-channel
// vectors (length C) they take and produce are combined with plain array
// arithmetic by the layer (mean, invstd, scale, the means of the gradient sums).
//
// Per-channel reductions over (n, h, w) -- bn_sums and bn_grad_sums -- take two
// passes, like bias_grad in dense.cu, with NO atomics and NO shared memory:
//   1. *_partial: the positions j = b * hw + s (s the pixel of a plane) of each
//      channel are cut into chunks of `chunk`; thread (k, ch) sums chunk k of
//      channel ch sequentially and writes its two sums to
//      partial[(k * 2 + r) * c + ch] (r = 0: first sum, r = 1: second);
//   2. dense.cu's bias_grad_finish over 2*c "channels" adds the chunks in
//      order: out[r * c + ch], i.e. the (2, c) result row-major.
// Every element of partial and of the result is written by exactly one thread,
// so the summation order is fixed: results are deterministic (the same on every
// run and launch shape) and the host emulator reproduces the GPU bit for bit.
// They differ from NumPy's sums (pairwise, in another order) in the last bits:
// the tests compare them within a tolerance.
//
// The element-wise kernels (bn_normalize, bn_backward) perform the reference's
// operations in its order; with --fmad=false they are bit-identical to it.
#include "common.cuh"

// Chunks of the first pass: at least one, so that an empty batch writes zeros.
__device__ __forceinline__ long long sb_chunks(long long positions, long long chunk) {
    return positions > 0 ? (positions + chunk - 1) / chunk : 1;
}

// What grid index t of a first pass sums: chunk k = t / c of channel ch = t % c, the
// positions [begin, end) of that channel's n * hw (none for an empty batch's chunk).
struct SbChunk {
    long long ch, k, begin, end;
};

__device__ __forceinline__ SbChunk sb_chunk(long long t, long long c, long long positions,
                                            long long chunk) {
    SbChunk q;
    q.ch = t % c;
    q.k = t / c;
    q.begin = q.k * chunk;
    q.end = q.begin + chunk < positions ? q.begin + chunk : positions;
    return q;
}

// The start of the plane of channel ch that holds position j (sample j / hw).
__device__ __forceinline__ long long sb_plane(long long j, long long c, long long ch,
                                              long long hw) {
    return ((j / hw) * c + ch) * hw;
}

// The next position: pixel s + 1 of the plane, or pixel 0 of the next sample's plane.
__device__ __forceinline__ void sb_step(long long& s, long long& plane, long long c,
                                        long long hw) {
    if (++s == hw) {
        s = 0;
        plane += c * hw;
    }
}

// The chunk's two sums, at partial[(k * 2 + r) * c + ch].
__device__ __forceinline__ void sb_store_pair(real* partial, SbChunk q, long long c, real s1,
                                              real s2) {
    partial[(q.k * 2) * c + q.ch] = s1;
    partial[(q.k * 2 + 1) * c + q.ch] = s2;
}

// Thread (k, ch): S1 = sum (x - shift[ch]), S2 = sum (x - shift[ch])^2 over chunk k.
extern "C" __global__ void bn_sums_partial(const real* x, const real* shift, real* partial,
                                           long long n, long long c, long long hw,
                                           long long chunk) {
    SB_GRID_LOOP(t, sb_chunks(n * hw, chunk) * c) {
        SbChunk q = sb_chunk(t, c, n * hw, chunk);
        real sh = shift[q.ch];
        real s1 = (real)0, s2 = (real)0;
        if (q.begin < q.end) {
            long long s = q.begin % hw, plane = sb_plane(q.begin, c, q.ch, hw);
            for (long long j = q.begin; j < q.end; ++j) {
                real d = x[plane + s] - sh;
                s1 = s1 + d;
                s2 = s2 + d * d;
                sb_step(s, plane, c, hw);
            }
        }
        sb_store_pair(partial, q, c, s1, s2);
    }
}

// Thread (k, ch): sum dy and sum dy * xhat over chunk k of channel ch.
extern "C" __global__ void bn_grad_sums_partial(const real* dy, const real* xhat, real* partial,
                                                long long n, long long c, long long hw,
                                                long long chunk) {
    SB_GRID_LOOP(t, sb_chunks(n * hw, chunk) * c) {
        SbChunk q = sb_chunk(t, c, n * hw, chunk);
        real s1 = (real)0, s2 = (real)0;
        if (q.begin < q.end) {
            long long s = q.begin % hw, plane = sb_plane(q.begin, c, q.ch, hw);
            for (long long j = q.begin; j < q.end; ++j) {
                real g = dy[plane + s];
                s1 = s1 + g;
                s2 = s2 + g * xhat[plane + s];
                sb_step(s, plane, c, hw);
            }
        }
        sb_store_pair(partial, q, c, s1, s2);
    }
}

// xhat = (x - mean[ch]) * invstd[ch];  y = xhat * gamma[ch] + beta[ch]
extern "C" __global__ void bn_normalize(const real* x, const real* mean, const real* invstd,
                                        const real* gamma, const real* beta, real* y,
                                        real* xhat, long long n, long long c, long long hw) {
    SB_GRID_LOOP(i, n * c * hw) {
        long long ch = (i / hw) % c;
        real xh = (x[i] - mean[ch]) * invstd[ch];
        xhat[i] = xh;
        y[i] = xh * gamma[ch] + beta[ch];
    }
}

// dx = ((dy - mean_dy[ch]) - xhat * mean_dy_xhat[ch]) * scale[ch]
// (scale = gamma * invstd; the means are over the global batch).
extern "C" __global__ void bn_backward(const real* dy, const real* xhat, const real* scale,
                                       const real* mean_dy, const real* mean_dy_xhat, real* dx,
                                       long long n, long long c, long long hw) {
    SB_GRID_LOOP(i, n * c * hw) {
        long long ch = (i / hw) % c;
        real t = dy[i] - mean_dy[ch];
        t = t - xhat[i] * mean_dy_xhat[ch];
        dx[i] = t * scale[ch];
    }
}
