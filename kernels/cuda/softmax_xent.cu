// Fused softmax cross-entropy, forward and backward in one pass over the logits.
//
// For row r with label t (n rows, k classes), with m = max_j x_j and s = sum_j exp(x_j - m):
//   loss_r  = log(s) - (x_t - m)
//   dx_rj   = (exp(x_j - m) / s - [j == t]) / n        (gradient of the MEAN loss)
// The mean of loss_r is taken by the caller. One thread per row (k is small: 10
// classes); the operations follow syncbench.kernels.ops.softmax_xent in order.
// A label outside [0, k) is never used as an index: its row's loss and gradient
// become NaN and bad[0] is set to 1 (the caller raises; host labels are checked
// before the launch).
#include "common.cuh"

extern "C" __global__ void softmax_xent(const real* logits, const long long* labels,
                                        real* dlogits, real* row_loss, int* bad,
                                        long long rows, long long classes) {
    SB_GRID_LOOP(r, rows) {
        const real* x = logits + r * classes;
        real* d = dlogits + r * classes;
        long long t = labels[r];
        if (t < 0 || t >= classes) {
            real q = (real)nan("");
            row_loss[r] = q;
            for (long long j = 0; j < classes; ++j) d[j] = q;
            bad[0] = 1;
            continue;
        }
        real m = x[0];
        for (long long j = 1; j < classes; ++j) m = x[j] > m ? x[j] : m;
        real s = (real)0;
        for (long long j = 0; j < classes; ++j) {
            real e = exp(x[j] - m);
            d[j] = e;
            s = s + e;
        }
        row_loss[r] = log(s) - (x[t] - m);
        real scale = (real)rows;
        for (long long j = 0; j < classes; ++j) {
            real p = d[j] / s;
            if (j == t) p = p - (real)1;
            d[j] = p / scale;
        }
    }
}
