// The transformer's (gpt's) non-GEMM passes: LayerNorm, GELU, the causal softmax of
// attention and the embedding's scatter-add (NumPy references in
// syncbench.kernels.transformer_ops, dispatched by syncbench.kernels.ops).
//
// As in every source here: grid-stride loops, each output element written by one
// thread, no shared memory, atomics or barriers, so the results do not depend on the
// launch shape and the host emulator reproduces the GPU.
//
// * Element-wise passes (layernorm_normalize, layernorm_backward_dx, gelu_backward,
//   embedding_*) do the reference's operations in its order: with --fmad=false they
//   equal it to the bit.
// * Row reductions (layernorm_stats, layernorm_backward_stats, the causal softmax) have
//   one thread per row summing in index order; NumPy sums pairwise, so they differ
//   from it in the last bits. gelu_forward and causal_softmax_forward call the device's
//   tanh and exp, which are not NumPy's.
// * Column sums (LayerNorm's gain and bias gradients) take two passes like dense.cu's
//   bias_grad: layernorm_param_grad_partial, then bias_grad_finish.
#include "common.cuh"

// GELU's constants as transformer_ops.py has them: sqrt(2/pi), 0.044715 and 3 * 0.044715,
// each the double the Python expression gives, rounded to real as NumPy rounds it.
#define SB_GELU_C ((real)0.7978845608028654)
#define SB_GELU_A ((real)0.044715)
#define SB_GELU_3A ((real)(3.0 * 0.044715))

// -- LayerNorm over the last axis: x (rows, d) -------------------------------------------
// Thread r: mean[r] = sum_j x / d; var = sum_j (x - mean)^2 / d; rstd[r] = 1 / sqrt(var + eps).
extern "C" __global__ void layernorm_stats(const real* x, real* mean, real* rstd, real eps,
                                           long long rows, long long d) {
    SB_GRID_LOOP(r, rows) {
        const real* xr = x + r * d;
        real s = (real)0;
        for (long long j = 0; j < d; ++j) s = s + xr[j];
        real mu = s / (real)d;
        real q = (real)0;
        for (long long j = 0; j < d; ++j) {
            real c = xr[j] - mu;
            q = q + c * c;
        }
        mean[r] = mu;
        rstd[r] = (real)1 / sqrt(q / (real)d + eps);
    }
}

// xhat = (x - mean[r]) * rstd[r];  y = xhat * gamma[j] + beta[j]
extern "C" __global__ void layernorm_normalize(const real* x, const real* mean,
                                               const real* rstd, const real* gamma,
                                               const real* beta, real* y, real* xhat,
                                               long long rows, long long d) {
    SB_GRID_LOOP(i, rows * d) {
        long long r = i / d, j = i % d;
        real xh = (x[i] - mean[r]) * rstd[r];
        xhat[i] = xh;
        y[i] = xh * gamma[j] + beta[j];
    }
}

// Thread r: with g = dy * gamma, mg[r] = sum_j g / d and mgx[r] = sum_j g * xhat / d.
extern "C" __global__ void layernorm_backward_stats(const real* dy, const real* xhat,
                                                    const real* gamma, real* mg, real* mgx,
                                                    long long rows, long long d) {
    SB_GRID_LOOP(r, rows) {
        const real* dyr = dy + r * d;
        const real* xr = xhat + r * d;
        real s1 = (real)0, s2 = (real)0;
        for (long long j = 0; j < d; ++j) {
            real g = dyr[j] * gamma[j];
            s1 = s1 + g;
            s2 = s2 + g * xr[j];
        }
        mg[r] = s1 / (real)d;
        mgx[r] = s2 / (real)d;
    }
}

// dx = rstd[r] * ((dy * gamma[j] - mg[r]) - xhat * mgx[r])
extern "C" __global__ void layernorm_backward_dx(const real* dy, const real* xhat,
                                                 const real* gamma, const real* rstd,
                                                 const real* mg, const real* mgx, real* dx,
                                                 long long rows, long long d) {
    SB_GRID_LOOP(i, rows * d) {
        long long r = i / d, j = i % d;
        real a = dy[i] * gamma[j] - mg[r];
        a = a - xhat[i] * mgx[r];
        dx[i] = rstd[r] * a;
    }
}

// Thread (k, j), k = t / d: the sums of dy * xhat and of dy over rows [k * chunk,
// (k + 1) * chunk) of column j, at partial[(k * 2) * d + j] and partial[(k * 2 + 1) * d + j]
// (dense.cu's bias_grad_finish over 2 * d columns then adds the chunks in order: the
// gain's gradient in row 0 of its (2, d) result, the bias's in row 1).
extern "C" __global__ void layernorm_param_grad_partial(const real* dy, const real* xhat,
                                                        real* partial, long long rows,
                                                        long long d, long long chunk) {
    long long chunks = rows > 0 ? (rows + chunk - 1) / chunk : 1;
    SB_GRID_LOOP(t, chunks * d) {
        long long j = t % d, k = t / d;
        long long end = (k + 1) * chunk < rows ? (k + 1) * chunk : rows;
        real s1 = (real)0, s2 = (real)0;
        for (long long r = k * chunk; r < end; ++r) {
            real g = dy[r * d + j];
            s1 = s1 + g * xhat[r * d + j];
            s2 = s2 + g;
        }
        partial[(k * 2) * d + j] = s1;
        partial[(k * 2 + 1) * d + j] = s2;
    }
}

// -- GELU, tanh approximation ------------------------------------------------------------
// t = tanh(((x * x) * x * A + x) * C);  y = ((t + 1) * x) * 0.5  (t kept for the backward)
extern "C" __global__ void gelu_forward(const real* x, real* y, real* t, long long n) {
    SB_GRID_LOOP(i, n) {
        real xi = x[i];
        real u = xi * xi;
        u = u * xi;
        u = u * SB_GELU_A;
        u = u + xi;
        u = u * SB_GELU_C;
        real ti = tanh(u);
        t[i] = ti;
        real yi = (ti + (real)1) * xi;
        y[i] = yi * (real)0.5;
    }
}

// dx = dy * ((((x^2 * 3A + 1) * C * (1 - t^2)) * x + t + 1) * 0.5), in the reference's order.
extern "C" __global__ void gelu_backward(const real* dy, const real* x, const real* t,
                                         real* dx, long long n) {
    SB_GRID_LOOP(i, n) {
        real xi = x[i], ti = t[i];
        real s = xi * xi;
        s = s * SB_GELU_3A;
        s = s + (real)1;
        s = s * SB_GELU_C;
        real om = ti * ti;
        om = (real)1 - om;
        s = s * om;
        s = s * xi;
        s = s + ti;
        s = s + (real)1;
        s = s * (real)0.5;
        dx[i] = s * dy[i];
    }
}

// -- causal softmax: rows of (..., t, t) score matrices ------------------------------------
// Row r is query position i = r % t of its matrix: p_j = exp(s_j * scale - m) / sum for
// j <= i (m the maximum of those), p_j = 0 for j > i (the mask: exp(-inf) in the reference).
extern "C" __global__ void causal_softmax_forward(const real* scores, real* probs, real scale,
                                                  long long rows, long long t) {
    SB_GRID_LOOP(r, rows) {
        const real* s = scores + r * t;
        real* p = probs + r * t;
        long long last = r % t;
        real m = s[0] * scale;
        for (long long j = 1; j <= last; ++j) {
            real v = s[j] * scale;
            m = v > m ? v : m;
        }
        real sum = (real)0;
        for (long long j = 0; j <= last; ++j) {
            real e = exp(s[j] * scale - m);
            p[j] = e;
            sum = sum + e;
        }
        for (long long j = 0; j <= last; ++j) p[j] = p[j] / sum;
        for (long long j = last + 1; j < t; ++j) p[j] = (real)0;
    }
}

// ds_j = (p_j * (dp_j - sum_k dp_k * p_k)) * scale over every j of row r (masked p_j = 0).
extern "C" __global__ void causal_softmax_backward(const real* dp, const real* probs, real* ds,
                                                   real scale, long long rows, long long t) {
    SB_GRID_LOOP(r, rows) {
        const real* g = dp + r * t;
        const real* p = probs + r * t;
        real* out = ds + r * t;
        real dot = (real)0;
        for (long long j = 0; j < t; ++j) dot = dot + g[j] * p[j];
        for (long long j = 0; j < t; ++j) out[j] = (p[j] * (g[j] - dot)) * scale;
    }
}

// -- embedding backward --------------------------------------------------------------------
// Scatter-add by sorted segments, deterministic and without atomics: the caller sorts
// the positions by token (order: positions of token 0, then token 1..., each in position
// order) and gives start[v], start[v + 1] the segment of token v. Thread (v, c) adds the
// rows of its segment, in position order, to wte_grad[v, c] (added to what is there, the
// tied output layer's part), as np.add.at does: the same sums in the same order.
extern "C" __global__ void embedding_token_grad(const real* dh, const long long* order,
                                                const long long* start, real* wte_grad,
                                                long long vocab, long long d) {
    SB_GRID_LOOP(i, vocab * d) {
        long long v = i / d, c = i % d;
        real acc = wte_grad[i];
        for (long long k = start[v]; k < start[v + 1]; ++k) acc = acc + dh[order[k] * d + c];
        wte_grad[i] = acc;
    }
}

// wpe_grad[p, c] = sum over the batch b of dh[b, p, c] (in b order, as NumPy sums an outer
// axis) for p < t; 0 for the positions p in [t, ctx) the windows do not reach.
extern "C" __global__ void embedding_position_grad(const real* dh, real* wpe_grad,
                                                   long long batch, long long t,
                                                   long long ctx, long long d) {
    SB_GRID_LOOP(i, ctx * d) {
        long long p = i / d;
        if (p >= t || batch == 0) {
            wpe_grad[i] = (real)0;
            continue;
        }
        real acc = dh[i];
        for (long long b = 1; b < batch; ++b) acc = acc + dh[b * t * d + i];
        wpe_grad[i] = acc;
    }
}
