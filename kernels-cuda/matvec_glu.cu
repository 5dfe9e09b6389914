// matvec_glu.cu: out = silu(W_gate x) * (W_up x) in one pass over both weights, one kernel per
// weight format (matvec.cuh). Used by matmul_swiglu and the MoE gate/up products.
#include "matvec.cuh"

#define MATVEC_GLU_KERNEL(name, F) \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_glu_##name(const Args a) { matvec<F, true>(a); }

FOR_EACH_FORMAT(MATVEC_GLU_KERNEL)
