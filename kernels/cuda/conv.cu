// im2col / col2im for a zero-padded k x k convolution of NCHW input, windows `stride` apart.
//
// The output sides are oh = (h + 2*pad - k) / stride + 1 (likewise ow), as
// syncbench.kernels.ops.conv_output_hw computes them; with stride 2 and an
// even padded side the last padded row/column is in no window.
//
// cols has shape (c*k*k, n*oh*ow): row (ch, ki, kj), column (b, oy, ox), the
// layout of syncbench.kernels.layers.Conv2d, so the forward pass is one GEMM
// W (cout, c*k*k) @ cols; output (oy, ox) reads input (oy*stride + ki - pad,
// ox*stride + kj - pad). col2im gathers (one thread per input pixel, no
// atomics): a pixel (y, x) receives window (ki, kj) of output (oy, ox) when
// y + pad - ki = oy*stride (likewise x), and it adds those contributions in
// (ki, kj) order starting from zero, as the NumPy reference does
// (bit-identical results).
#include "common.cuh"

extern "C" __global__ void im2col(const real* x, real* cols, long long n, long long c,
                                  long long h, long long w, long long k, long long pad,
                                  long long stride) {
    long long oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    long long positions = n * oh * ow;
    SB_GRID_LOOP(i, c * k * k * positions) {
        long long col = i % positions, q = i / positions;
        long long kj = q % k, ki = (q / k) % k, ch = q / (k * k);
        long long ox = col % ow, oy = (col / ow) % oh, b = col / (oh * ow);
        long long iy = oy * stride + ki - pad, ix = ox * stride + kj - pad;
        bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
        cols[i] = inside ? x[((b * c + ch) * h + iy) * w + ix] : (real)0;
    }
}

extern "C" __global__ void col2im(const real* cols, real* dx, long long n, long long c,
                                  long long h, long long w, long long k, long long pad,
                                  long long stride) {
    long long oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    long long positions = n * oh * ow;
    SB_GRID_LOOP(i, n * c * h * w) {
        long long x = i % w, y = (i / w) % h, ch = (i / (w * h)) % c, b = i / (w * h * c);
        real acc = (real)0;
        for (long long ki = 0; ki < k; ++ki) {
            long long ty = y + pad - ki;  // = oy * stride for the window that holds y
            if (ty < 0 || ty % stride) continue;
            long long oy = ty / stride;
            if (oy >= oh) continue;
            for (long long kj = 0; kj < k; ++kj) {
                long long tx = x + pad - kj;
                if (tx < 0 || tx % stride) continue;
                long long ox = tx / stride;
                if (ox >= ow) continue;
                acc = acc + cols[((ch * k + ki) * k + kj) * positions + (b * oh + oy) * ow + ox];
            }
        }
        dx[i] = acc;
    }
}
