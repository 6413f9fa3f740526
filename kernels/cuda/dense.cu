// ReLU, bias add and the bias-gradient reduction (references in syncbench.kernels.ops).
//
// Compiled per precision with -DSB_REAL=float|double and --fmad=false.
// Grid-stride loops; each output element is written by exactly one thread.
#include "common.cuh"

// y = x * (x > 0), as the CPU path computes it: NaN stays NaN (and -inf gives NaN,
// 0 * -inf), a negative x gives -0.
extern "C" __global__ void relu_forward(const real* x, real* y, long long n) {
    SB_GRID_LOOP(i, n) {
        real xi = x[i];
        y[i] = xi * (real)(xi > (real)0);
    }
}

// dx = dy * (y > 0) with y the forward output: a NaN gradient stays NaN where y <= 0,
// as on the CPU path (a multiply by the mask, not a select)
extern "C" __global__ void relu_backward(const real* dy, const real* y, real* dx, long long n) {
    SB_GRID_LOOP(i, n) { dx[i] = dy[i] * (real)(y[i] > (real)0); }
}

// Bias of a tensor viewed as (outer, channels, inner): y[o, c, i] += b[c].
// A Linear output (rows, cols) is (rows, cols, 1); a convolution output in the
// (cout, n*oh*ow) layout is (1, cout, n*oh*ow).
extern "C" __global__ void bias_add(real* y, const real* b, long long outer, long long channels,
                                    long long inner) {
    SB_GRID_LOOP(i, outer * channels * inner) { y[i] = y[i] + b[(i / inner) % channels]; }
}

// Per-channel sums in two passes, without atomics or shared memory: every partial
// sum and every result is written by one thread, in a fixed order, so the result
// is deterministic and the host emulator reproduces the GPU exactly.
// First pass of db[c] = sum_{o, i} dy[o, c, i]: the (o, i) positions, in order
// j = o * inner + i, are cut into chunks of `chunk`; thread (k, c) sums chunk k
// of channel c sequentially into partial[k * channels + c].
extern "C" __global__ void bias_grad_partial(const real* dy, real* partial, long long outer,
                                             long long channels, long long inner,
                                             long long chunk) {
    long long positions = outer * inner;
    long long chunks = positions > 0 ? (positions + chunk - 1) / chunk : 1;  // empty: zeros
    SB_GRID_LOOP(t, chunks * channels) {
        long long c = t % channels;
        long long k = t / channels;
        long long end = (k + 1) * chunk < positions ? (k + 1) * chunk : positions;
        real acc = (real)0;
        for (long long j = k * chunk; j < end; ++j)
            acc = acc + dy[((j / inner) * channels + c) * inner + j % inner];
        partial[t] = acc;
    }
}

// Second pass: db[c] = sum_k partial[k, c], in chunk order. BatchNorm's sums
// (batchnorm.cu) finish with it too, as 2 * C channels.
extern "C" __global__ void bias_grad_finish(const real* partial, real* db, long long chunks,
                                            long long channels) {
    SB_GRID_LOOP(c, channels) {
        real acc = (real)0;
        for (long long k = 0; k < chunks; ++k) acc = acc + partial[k * channels + c];
        db[c] = acc;
    }
}
