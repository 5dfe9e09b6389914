// matvec_q8.cu: the fast-tier decode matrix-vector kernels (matvec_q8.cuh), plain and GLU, each
// also with a MoE layer's shared expert (`_sh_`, common.cuh MvShared), for the formats of
// FOR_EACH_Q8_FORMAT.
#include "matvec_q8.cuh"

#define MATVEC_Q8_KERNELS(name, F)                                                                             \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_q8_##name(const Args a) { matvec_q8<F, false>(a); }    \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_q8_glu_##name(const Args a) { matvec_q8<F, true>(a); } \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_q8_sh_##name(const Args a) {                           \
        matvec_q8<F, false, true>(a);                                                                          \
    }                                                                                                          \
    KERNEL void __launch_bounds__(MV_THREADS, 2) matvec_q8_glu_sh_##name(const Args a) {                       \
        matvec_q8<F, true, true>(a);                                                                           \
    }

FOR_EACH_Q8_FORMAT(MATVEC_Q8_KERNELS)
