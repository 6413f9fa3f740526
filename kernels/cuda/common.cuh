// Shared by every kernel source: the precision of a build and the grid-stride loop.
//
// Each source is compiled once per precision with -DSB_REAL=float or
// -DSB_REAL=double (syncbench.kernels.cuda_launch.compile_options, which also
// puts this folder on the include path for NVRTC).
#ifndef SB_COMMON_CUH
#define SB_COMMON_CUH

#ifndef SB_REAL
#define SB_REAL float
#endif
typedef SB_REAL real;

// Grid-stride loop: every index in [0, n) is visited by exactly one thread.
#define SB_GRID_LOOP(i, n)                                                   \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;     \
         i < (n); i += (long long)gridDim.x * blockDim.x)

#endif  // SB_COMMON_CUH
