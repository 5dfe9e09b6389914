// matvec.cu: the plain matrix-vector kernels, one per weight format (matvec.cuh).
#include "matvec.cuh"

#define MATVEC_KERNEL(name, F) \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_##name(const Args a) { matvec<F, false>(a); }

FOR_EACH_FORMAT(MATVEC_KERNEL)
