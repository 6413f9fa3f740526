/* Direct 3-D-blocked convolution on the CPU layout (C, H, W, N): no column matrix.
 *
 * The CPU layers keep activations batch-innermost, (C, H, W, N) (kernels/cpu_conv.py).
 * In that layout the N samples of one pixel of one channel are one contiguous run, so a
 * vector register holds 16 samples of one pixel, and a convolution is, per output pixel,
 * a small GEMM whose K operand is the C*k*k window rows, read where they lie in the
 * padded planes (an "implicit GEMM": the im2col matrix is never written). The register
 * block is KB output channels by NB vectors of samples (KB x NB accumulators, each FMA'd
 * with a broadcast weight), as in the micro-kernels of BLIS (Van Zee and van de Geijn
 * 2015, "BLIS: a framework for rapidly instantiating BLAS functionality") and of
 * oneDNN's direct convolutions, whose channel blocking ("nChw16c") puts channels in
 * the vector where this layout puts samples.
 *
 * Vectors are GCC's generic vectors (vector_size 64: one AVX-512 register, two AVX2
 * ones), so the file is plain GNU C; kernels/cpu_native.py builds it with -O3
 * -march=native for the core it runs on. Sums run in a fixed order (channel, row,
 * column of the window) per output element, which differs from BLAS's order: float32
 * results match the NumPy path to rounding (tests/unit/test_cpu_native.py).
 *
 * Every function takes N a multiple of 16 and contiguous float32 arrays; the Python
 * side (kernels/cpu_native.py) checks both and falls back to the NumPy path otherwise.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64)));

#define VL 16 /* floats per vector */
#define KB 4  /* output channels per register block (forward) */
#define NBMAX 4 /* sample vectors per register block (forward): 64 samples */
#define QB 6  /* window taps per register block (weight gradient) */
#define TILE_PIXELS 32 /* output pixels at least per pass of the weight gradient's blocks */

static inline v16 load(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, v16 v) { memcpy(p, &v, sizeof v); }
/* A store that bypasses the caches (``p`` 64-byte aligned): see sb_correlate. */
static inline void stream_store(float *p, v16 v)
{
#ifdef __AVX512F__
    _mm512_stream_ps(p, (__m512)v);
#else
    store(p, v);
#endif
}
static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
/* A loaded vector kept in its register: without this GCC folds the load into each FMA
 * that uses it (one load per FMA instead of one per vector), and the loads, not the
 * FMAs, then bound the loop. */
#ifdef __AVX512F__
static inline v16 held(v16 v) { __asm__("" : "+v"(v)); return v; }
#else
/* Without AVX-512 a 64-byte vector is two registers, which no asm operand can name: the
 * compiler's own choice stands (tests/unit/test_cpu_native.py holds on AVX2 cores too). */
static inline v16 held(v16 v) { return v; }
#endif

/* One register block of the forward pass: out[a, pixel, v*16 .. v*16+15] for a < kbn,
 * v < nb, summed over the window's taps (c, i, j) flattened: ``tap[q]`` is tap q's offset
 * in the padded planes from ``x``, the window's top-left corner for this pixel and sample
 * block, and ``w`` the packed weights of this channel block, (C*k*k, KB). */
static inline __attribute__((always_inline)) void forward_block(
    const float *restrict x, const float *restrict w, float *restrict y, size_t y_chan,
    const size_t *restrict tap, int taps, const float *bias, int stream, const int kbn,
    const int nb)
{
    v16 acc[KB][NBMAX];
    for (int a = 0; a < kbn; a++)
        for (int v = 0; v < nb; v++)
            acc[a][v] = splat(bias ? bias[a] : 0.0f);
    for (int q = 0; q < taps; q++) {
        const float *xr = x + tap[q];
        const float *wr = w + q * KB;
        v16 xv[NBMAX];
        for (int v = 0; v < nb; v++)
            xv[v] = held(load(xr + v * VL));
        for (int a = 0; a < kbn; a++) {
            v16 b = splat(wr[a]);
            for (int v = 0; v < nb; v++)
                acc[a][v] += b * xv[v];
        }
    }
    if (stream)
        for (int a = 0; a < kbn; a++)
            for (int v = 0; v < nb; v++)
                stream_store(y + a * y_chan + v * VL, acc[a][v]);
    else
        for (int a = 0; a < kbn; a++)
            for (int v = 0; v < nb; v++)
                store(y + a * y_chan + v * VL, acc[a][v]);
}

typedef void (*forward_fn)(const float *restrict, const float *restrict, float *restrict,
                           size_t, const size_t *restrict, int, const float *, int);

#define FORWARD(KBN, NB)                                                                  \
    static void forward_##KBN##_##NB(const float *restrict x, const float *restrict w,    \
                                     float *restrict y, size_t y_chan,                    \
                                     const size_t *restrict tap, int taps,                \
                                     const float *bias, int stream)                       \
    {                                                                                     \
        forward_block(x, w, y, y_chan, tap, taps, bias, stream, KBN, NB);                 \
    }
#define FORWARD_ROW(KBN) FORWARD(KBN, 1) FORWARD(KBN, 2) FORWARD(KBN, 3) FORWARD(KBN, 4)
FORWARD_ROW(1)
FORWARD_ROW(2)
FORWARD_ROW(3)
FORWARD_ROW(4)

static const forward_fn FORWARD_TABLE[KB + 1][NBMAX + 1] = {
    {0, 0, 0, 0, 0},
    {0, forward_1_1, forward_1_2, forward_1_3, forward_1_4},
    {0, forward_2_1, forward_2_2, forward_2_3, forward_2_4},
    {0, forward_3_1, forward_3_2, forward_3_3, forward_3_4},
    {0, forward_4_1, forward_4_2, forward_4_3, forward_4_4},
};


/* The general form: y[a, oy, ox, :] = bias[a] + sum over q of w[a, q] * x[tap[q] +
 * oy * x_row + ox * x_col + :], for K output channels, an oh x ow grid of output pixels
 * and n samples. A convolution is the case of taps (c, i, j) and steps of ``stride``
 * pixels; each phase of a strided convolution's input gradient is another (the output
 * gradient's taps that reach one residue class of input pixels, written to every
 * stride-th pixel: kernels/cpu_native.py). ``wpack`` holds w packed by channel block,
 * ((K + 3) / 4, taps, 4), zero where K runs out; ``bias`` is K values or NULL; ``y``'s
 * strides are in floats (samples contiguous). Pixels outermost, so the taps' runs of one
 * pixel stay in cache across the channel blocks. Where ``y`` is 64-byte aligned with
 * strides of whole vectors, the outputs are stored past the caches (non-temporal
 * stores): each pixel writes 4 channels' lines a plane apart, and reading each line for
 * ownership first took 0.5 of a 16-channel 28 x 28 convolution's 2.2 ms here, for lines
 * that are wholly overwritten (docs/RESULTS.md). */
void sb_correlate(const float *x, size_t x_row, size_t x_col, const size_t *tap, int taps,
                  const float *wpack, const float *bias, float *y, size_t y_chan,
                  size_t y_row, size_t y_col, int k_out, int oh, int ow, int n)
{
    const size_t w_block = (size_t)taps * KB;
    const int vectors = n / VL;
    const int stream = (uintptr_t)y % 64 == 0 && (y_chan | y_row | y_col) % VL == 0;
    for (int oy = 0; oy < oh; oy++) {
        for (int ox = 0; ox < ow; ox++) {
            const float *xp = x + oy * x_row + ox * x_col;
            float *yp = y + oy * y_row + ox * y_col;
            for (int kb = 0; kb < k_out; kb += KB) {
                const int kbn = k_out - kb < KB ? k_out - kb : KB;
                for (int v0 = 0; v0 < vectors; v0 += NBMAX) {
                    const int nb = vectors - v0 < NBMAX ? vectors - v0 : NBMAX;
                    FORWARD_TABLE[kbn][nb](xp + v0 * VL, wpack + (kb / KB) * w_block,
                                           yp + kb * y_chan + v0 * VL, y_chan, tap, taps,
                                           bias ? bias + kb : 0, stream);
                }
            }
        }
    }
}

/* One register block of the weight gradient over one output row: for a < kbn output
 * channels and q < qbn window taps (flattened (c, i, j), offsets ``tap``), acc[q][a]
 * (16 lanes, summed over samples later) += dy[a, pixel, :] * x[tap q of pixel, :] for
 * every pixel of the row. ``acc`` is kept in memory between rows, (QB, KB, 16). */
static inline __attribute__((always_inline)) void weight_block(
    const float *restrict x, const float *restrict dy, float *restrict acc_mem,
    const size_t *restrict tap, size_t dy_chan, int rows, int ow, size_t x_row_step,
    size_t x_col_step, int vectors, const int kbn, const int qbn)
{
    v16 acc[QB][KB];
    for (int q = 0; q < qbn; q++)
        for (int a = 0; a < kbn; a++)
            acc[q][a] = load(acc_mem + (q * KB + a) * VL);
    for (int r = 0; r < rows; r++)
    for (int ox = 0; ox < ow; ox++) {
        const float *xp = x + r * x_row_step + ox * x_col_step;
        const float *dp = dy + ((size_t)r * ow + ox) * vectors * VL;
        for (int v = 0; v < vectors; v++) {
            v16 d[KB];
            for (int a = 0; a < kbn; a++)
                d[a] = held(load(dp + a * dy_chan + v * VL));
            for (int q = 0; q < qbn; q++) {
                v16 xv = held(load(xp + tap[q] + v * VL));
                for (int a = 0; a < kbn; a++)
                    acc[q][a] += d[a] * xv;
            }
        }
    }
    for (int q = 0; q < qbn; q++)
        for (int a = 0; a < kbn; a++)
            store(acc_mem + (q * KB + a) * VL, acc[q][a]);
}

typedef void (*weight_fn)(const float *restrict, const float *restrict, float *restrict,
                          const size_t *restrict, size_t, int, int, size_t, size_t, int);

#define WEIGHT(KBN, QBN)                                                                  \
    static void weight_##KBN##_##QBN(const float *restrict x, const float *restrict dy,   \
                                     float *restrict acc, const size_t *restrict tap,     \
                                     size_t dy_chan, int rows, int ow, size_t x_row_step, \
                                     size_t x_col_step, int vectors)                      \
    {                                                                                     \
        weight_block(x, dy, acc, tap, dy_chan, rows, ow, x_row_step, x_col_step, vectors, \
                     KBN, QBN);                                                           \
    }
#define WEIGHT_ROW(KBN)                                                                   \
    WEIGHT(KBN, 1) WEIGHT(KBN, 2) WEIGHT(KBN, 3) WEIGHT(KBN, 4) WEIGHT(KBN, 5)            \
    WEIGHT(KBN, 6)
WEIGHT_ROW(1)
WEIGHT_ROW(2)
WEIGHT_ROW(3)
WEIGHT_ROW(4)

static const weight_fn WEIGHT_TABLE[KB + 1][QB + 1] = {
    {0, 0, 0, 0, 0, 0, 0},
    {0, weight_1_1, weight_1_2, weight_1_3, weight_1_4, weight_1_5, weight_1_6},
    {0, weight_2_1, weight_2_2, weight_2_3, weight_2_4, weight_2_5, weight_2_6},
    {0, weight_3_1, weight_3_2, weight_3_3, weight_3_4, weight_3_5, weight_3_6},
    {0, weight_4_1, weight_4_2, weight_4_3, weight_4_4, weight_4_5, weight_4_6},
};

/* dweight (K, C, k, k) = sum over pixels and samples of dy (K, OH, OW, N) times the
 * window of planes (C, Hp, Wp, N), stride ``s``. ``work`` holds ((C*k*k + 5) / 6 * 6)
 * * 4 * 16 floats of lane partial sums; ``tap`` the C*k*k offsets of the window's taps
 * (c, i, j) in the planes, the forward pass's (kernels/cpu_native.py window_taps). Channel
 * blocks outermost, then tiles of whole output rows, at least TILE_PIXELS pixels (a
 * 7-pixel row alone would load and store the accumulators every 28 vectors): a tile of
 * dy for 4 channels stays in cache while every tap block passes over it. */
void sb_conv_weight_grad(const float *planes, const float *dy, float *dweight, float *work,
                         const size_t *tap, int c_in, int wp, int n, int k_out, int k, int s,
                         int oh, int ow)
{
    const size_t x_row = (size_t)wp * n;
    const size_t dy_chan = (size_t)oh * ow * n;
    const int taps = c_in * k * k, vectors = n / VL;
    const int tile = (TILE_PIXELS + ow - 1) / ow;
    for (int kb = 0; kb < k_out; kb += KB) {
        const int kbn = k_out - kb < KB ? k_out - kb : KB;
        memset(work, 0, sizeof(float) * (size_t)((taps + QB - 1) / QB * QB) * KB * VL);
        for (int oy = 0; oy < oh; oy += tile) {
            const int rows = oh - oy < tile ? oh - oy : tile;
            const float *x = planes + (size_t)oy * s * x_row;
            const float *d = dy + kb * dy_chan + (size_t)oy * ow * n;
            for (int q0 = 0; q0 < taps; q0 += QB) {
                const int qbn = taps - q0 < QB ? taps - q0 : QB;
                WEIGHT_TABLE[kbn][qbn](x, d, work + (size_t)q0 * KB * VL, tap + q0, dy_chan,
                                       rows, ow, (size_t)s * x_row, (size_t)s * n, vectors);
            }
        }
        for (int q = 0; q < taps; q++) {
            for (int a = 0; a < kbn; a++) {
                v16 lanes = load(work + ((size_t)q * KB + a) * VL);
                float sum = 0.0f;
                for (int l = 0; l < VL; l++)
                    sum += lanes[l];
                dweight[(size_t)(kb + a) * taps + q] = sum;
            }
        }
    }
}
