// The parameter-free pieces of a ResNet (references in syncbench.kernels.ops): the
// residual sum with its ReLU, He et al.'s option-A shortcut and global average
// pooling, NCHW.
//
// Grid-stride loops, one thread per output element, no atomics or shared
// memory. add_relu, the shortcut and avgpool_backward are element-wise (a
// copy, a select or one multiply each) and bit-identical to the references.
// avgpool_forward is a reduction: one thread sums its plane's h*w values
// sequentially (a fixed order: deterministic, and reproduced bit for bit by
// the host emulator), then multiplies by 1/(h*w) as the reference does; NumPy
// sums the plane pairwise, so the two may differ in the last bits.
#include "common.cuh"

// y = s * (s > 0) with s = a + b (relu_forward of the sum: NaN stays NaN, -0 stays -0).
extern "C" __global__ void add_relu(const real* a, const real* b, real* y, long long n) {
    SB_GRID_LOOP(i, n) {
        real s = a[i] + b[i];
        y[i] = s * (real)(s > (real)0);
    }
}

// Option-A shortcut: y (n, channels, oh, ow) with oh = ceil(h / stride), ow likewise:
// y[b, ch, oy, ox] = x[b, ch, oy * stride, ox * stride] for ch < c, 0 for the
// appended channels.
extern "C" __global__ void shortcut_forward(const real* x, real* y, long long n, long long c,
                                            long long h, long long w, long long channels,
                                            long long stride) {
    long long oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    SB_GRID_LOOP(i, n * channels * oh * ow) {
        long long ox = i % ow, oy = (i / ow) % oh, ch = (i / (ow * oh)) % channels;
        long long b = i / (ow * oh * channels);
        y[i] = ch < c ? x[((b * c + ch) * h + oy * stride) * w + ox * stride] : (real)0;
    }
}

// Its adjoint: dx (n, c, h, w) is dy[b, ch, y / stride, x / stride] at the sampled
// positions (y and x multiples of stride), 0 elsewhere; the gradients of the
// appended channels are dropped.
extern "C" __global__ void shortcut_backward(const real* dy, real* dx, long long n, long long c,
                                             long long h, long long w, long long channels,
                                             long long stride) {
    long long oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    SB_GRID_LOOP(i, n * c * h * w) {
        long long x = i % w, y = (i / w) % h, ch = (i / (w * h)) % c, b = i / (w * h * c);
        bool sampled = y % stride == 0 && x % stride == 0;
        dx[i] = sampled ? dy[((b * channels + ch) * oh + y / stride) * ow + x / stride]
                        : (real)0;
    }
}

// y[p] = (sum of plane p's hw values, in order) * inv, inv = 1/(h*w) rounded to real.
extern "C" __global__ void avgpool_forward(const real* x, real* y, long long planes,
                                           long long hw, real inv) {
    SB_GRID_LOOP(p, planes) {
        const real* plane = x + p * hw;
        real acc = (real)0;
        for (long long s = 0; s < hw; ++s) acc = acc + plane[s];
        y[p] = acc * inv;
    }
}

// dx[p, s] = dy[p] * inv for every pixel s of plane p.
extern "C" __global__ void avgpool_backward(const real* dy, real* dx, long long planes,
                                            long long hw, real inv) {
    SB_GRID_LOOP(i, planes * hw) { dx[i] = dy[i / hw] * inv; }
}
