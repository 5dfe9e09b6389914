// matvec_tc6.cu: the decode Q6_K matrix-vector products on the integer tensor cores
// (matvec_tc6.cuh), exact (strict tier): x prepared once per vector (mvtc_prep_Q6_K), then dense,
// fused-SwiGLU and MoE products through matvec_tc.cuh's body (slots documented there).
#include "matvec_tc6.cuh"
#include "out_prep.cuh"

// Slots: p0 x (f32 rows of n_in), p1 xb, p2 xs. Grid (n_in / 256, rows of x), 32 threads (one warp
// per 256 inputs).
KERNEL void __launch_bounds__(32) mvtc_prep_Q6_K(const Args a) {
    mvtc6::prep_x_body(mvtc6::PrepArgs{reinterpret_cast<const float*>(a.p[0]), reinterpret_cast<uint32_t*>(a.p[1]),
                                       reinterpret_cast<float*>(a.p[2])});
}

// dev/cuda/matvec_bench.cu on the H200, x prepared once (session 16): below 8192 rows 16 rows per
// block of 8 warps (ffn down 22.8 us, 4096 rows 9.1, 1024 rows 6.0), from 8192 rows 32 rows per
// block of 4 warps (`_tall_`: qkv 15.7 us against 15.9, the LM head 339 against 403 at R = 1).
// The shared-expert kernels may split their warps over a MoE sum's entries (rows of 2 super-
// blocks: the 35B-A3B's downs), matvec_tc.cuh.
KERNEL void __launch_bounds__(128) mvtc_tall_Q6_K(const Args a) { mvtc::mv_body<mvtc6::TcQ6K, 2, 4, false, true>(a); }
KERNEL void __launch_bounds__(256) mvtc_Q6_K(const Args a) { mvtc::mv_body<mvtc6::TcQ6K, 1, 8, false>(a); }
KERNEL void __launch_bounds__(256) mvtc_glu_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6K, 1, 8, true>(a);
    mvtc::glu_out_prep<16>(a);  // the down product's input (out_prep.cuh)
}
// With a MoE layer's shared expert as one more expert per token (common.cuh MvShared).
KERNEL void __launch_bounds__(256) mvtc_sh_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6K, 1, 8, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_sh_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6K, 1, 8, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);  // the MoE down product's input (out_prep.cuh)
}
