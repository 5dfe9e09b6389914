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

// 16 rows per block of 8 warps (the loads' alignment scheme needs KW = 8): dev/cuda/matvec_bench.cu
// on the H200, x prepared once, R = 1 at every size (qkv 17.2 us against the f32 kernels' 19.1,
// 4096 rows 9.8 against 11.5, ffn down 23.5 against 31.6, the LM head 390 against 393; R = 2
// is 1.7x slower: 152 registers against 96, one block per SM instead of two).
KERNEL void __launch_bounds__(256) mvtc_Q6_K(const Args a) { mvtc::mv_body<mvtc6::TcQ6K, 1, 8, false>(a); }
// Q4_K_M: a layer's one Q6_K projection (a Gated DeltaNet qkv, an attention v) and the Q4_K ones
// of the same input in one launch (one ramp and tail instead of two). The Q6_K product is the
// segment table's first entry, its blocks first (n9 of them), its x in the Q6_K layout at p4 / p5
// and its rows of n10 bytes (mv_body ALT); the Q4_K products follow with the usual slots.
KERNEL void __launch_bounds__(256) mvtc_mix_Q6_K_Q4_K(const Args a) {
    if ((long long)blockIdx.x < a.n[9])
        mvtc::mv_body<mvtc6::TcQ6K, 1, 8, false, true, false, false, true>(a);
    else
        mvtc::mv_body<mvtc::TcQ4K, 1, 8, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6K, 1, 8, true>(a);
    mvtc::glu_out_prep<16>(a);  // the down product's input (out_prep.cuh)
}
// With a MoE layer's shared expert as one more expert per token (common.cuh MvShared), rows
// realigned at run time (TcQ6KAny): the 35B-A3B's expert rows of 420 bytes, the warps split over
// a down product's entries (mvtc_sh_Q6_K 12.4 us per layer alone against matvec_sh_Q6_K's 16.6).
KERNEL void __launch_bounds__(256) mvtc_sh_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6KAny, 1, 8, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_sh_Q6_K(const Args a) {
    mvtc::mv_body<mvtc6::TcQ6KAny, 1, 8, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);  // the MoE down product's input (out_prep.cuh)
}
