// matvec_sh.cu: the matrix-vector kernels (matvec.cuh), plain and GLU, with a MoE layer's shared
// expert as one more expert per token (common.cuh MvShared; Backend::moe_experts_shared), one
// kernel per weight format.
#include "matvec.cuh"

#define MATVEC_SH_KERNELS(name, F)                                                                                \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_sh_##name(const Args a) { matvec<F, false, true>(a); }    \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_glu_sh_##name(const Args a) { matvec<F, true, true>(a); }

FOR_EACH_FORMAT(MATVEC_SH_KERNELS)
