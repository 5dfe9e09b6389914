// matvec_tc.cu: the decode Q4_K matrix-vector products on the tensor cores (matvec_tc.cuh), exact
// (strict tier): x prepared once per vector (mvtc_prep_Q4_K), then dense, fused-SwiGLU and MoE
// products of any count of vectors (grid.y), as matvec.cu's kernels are batched. Q8_0 and Q6_K:
// matvec_tc8.cu, matvec_tc6.cu (the same body, their own policies).
#include "matvec_tc.cuh"
#include "out_prep.cuh"

// Slots: p0 x (f32 rows of n_in), p1 xa, p2 xs. Grid (n_in / 256, rows of x), 32 threads.
KERNEL void __launch_bounds__(32) mvtc_prep_Q4_K(const Args a) {
    mvtc::prep_x_body(mvtc::PrepArgs{reinterpret_cast<const float*>(a.p[0]), reinterpret_cast<uint32_t*>(a.p[1]),
                                     reinterpret_cast<float*>(a.p[2])});
}

// 16 R rows per block of 32 KW threads. dev/cuda/matvec_bench.cu on the H200 (4096-wide rows but
// ffn down): R = 2, KW = 4 is the fastest for 8192 rows and more (qkv 10.8 us, ffn gate 13.5, the
// LM head 188), R = 1, KW = 8 below (4096 rows 6.8 us, 1024 rows 4.0, ffn down 14.1 against
// 20.1); the fused SwiGLU holds two matrices' loads: R = 1 (8 warps: 4 were slower end to end).
// The double-buffered loads that the Q8_0 kernels take (matvec_tc.cuh rows_db) measured slower
// for Q4_K on the H200: the 8192-row kernel at 211 registers fits two blocks per SM instead of
// three (a 9B layer's grouped qkv + z launch of 12352 rows then takes two waves: 16.5 -> 19.6 us
// per launch in RILL_PROFILE=1), and the 4096-row one gains nothing (12.6 -> 12.7 us); tg128 9B
// Q4_K_M 320.8 -> 316.5, 35B-A3B 366.0 -> 359.2 (dev/cuda/DECISIONS.md, tensor cores).
KERNEL void __launch_bounds__(128) mvtc_tall_Q4_K(const Args a) { mvtc::mv_body<mvtc::TcQ4K, 2, 4, false>(a); }
KERNEL void __launch_bounds__(256) mvtc_Q4_K(const Args a) { mvtc::mv_body<mvtc::TcQ4K, 1, 8, false>(a); }
// The tall kernel with the norm before it as its prologue (mv_body NORM: a layer's first products
// of the residual row the block before it finished; ops/linear.rs `normed_group`). Only this one:
// a NORM block pays the prologue (~2 us alone) in every wave, so the launches of several waves
// (the mixed Q6_K + Q4_K one, three waves on the 35B-A3B) and blocks that prepare 4 super-blocks
// per warp (4096-wide rows) measured slower than the norm's own launch (dev/cuda/DECISIONS.md,
// norms).
KERNEL void __launch_bounds__(128) mvtc_norm_tall_Q4_K(const Args a) {
    mvtc::mv_body<mvtc::TcQ4K, 2, 4, false, true, false, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_Q4_K(const Args a) {
    mvtc::mv_body<mvtc::TcQ4K, 1, 8, true>(a);
    mvtc::glu_out_prep<16>(a);  // the down product's input (out_prep.cuh)
}
// The SwiGLU of 8192 rows and more on the tall kernels' geometry (dev/cuda/matvec_bench.cu: one
// 12288 x 4096 product 13.4 us at R = 2, KW = 4 against 15.6 at R = 1, KW = 8); the two matrices'
// loads are taken one after the other (mv_body), so R = 2 fits.
KERNEL void __launch_bounds__(128) mvtc_glu_tall_Q4_K(const Args a) {
    mvtc::mv_body<mvtc::TcQ4K, 2, 4, true>(a);
    mvtc::glu_out_prep<32>(a);
}
// With a MoE layer's shared expert as one more expert per token (common.cuh MvShared).
KERNEL void __launch_bounds__(256) mvtc_sh_Q4_K(const Args a) {
    mvtc::mv_body<mvtc::TcQ4K, 1, 8, false, false, true>(a);
}
// A MoE layer's SwiGLU rows on blocks of 4 warps: the 35B-A3B's (9 entries x 32 blocks) were 1.1
// waves of two 8-warp blocks per SM on the H200; at 4 warps (five blocks per SM) they are one
// (tg128 347 -> 362 t/s; 32-row blocks of 4 warps: 349).
KERNEL void __launch_bounds__(128) mvtc_glu_sh_Q4_K(const Args a) {
    mvtc::mv_body<mvtc::TcQ4K, 1, 4, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);  // the MoE down product's input (out_prep.cuh)
}
