// Non-overlapping k x k max pooling (stride k), NCHW, sides divisible by k.
//
// The forward pass records, per output, the index ki*k + kj of the FIRST
// maximum of its window (NumPy argmax's rule: a NaN counts as the maximum, so
// the first NaN of a window wins and propagates, as on the CPU path); the
// backward pass routes each output gradient to that position, one thread per input element.
#include "common.cuh"

extern "C" __global__ void maxpool_forward(const real* x, real* y, int* argmax, long long planes,
                                           long long h, long long w, long long k) {
    long long oh = h / k, ow = w / k;
    SB_GRID_LOOP(i, planes * oh * ow) {
        long long ox = i % ow, oy = (i / ow) % oh, p = i / (ow * oh);
        const real* base = x + (p * h + oy * k) * w + ox * k;
        real best = base[0];
        int arg = 0;
        for (long long ki = 0; ki < k; ++ki) {
            for (long long kj = 0; kj < k; ++kj) {
                real v = base[ki * w + kj];
                if (v > best || (v != v && best == best)) {  // first NaN wins
                    best = v;
                    arg = (int)(ki * k + kj);
                }
            }
        }
        y[i] = best;
        argmax[i] = arg;
    }
}

extern "C" __global__ void maxpool_backward(const real* dy, const int* argmax, real* dx,
                                            long long planes, long long h, long long w,
                                            long long k) {
    long long oh = h / k, ow = w / k;
    SB_GRID_LOOP(i, planes * h * w) {
        long long x = i % w, y = (i / w) % h, p = i / (w * h);
        long long o = (p * oh + y / k) * ow + x / k;
        dx[i] = argmax[o] == (int)((y % k) * k + x % k) ? dy[o] : (real)0;
    }
}
