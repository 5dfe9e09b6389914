// matvec_tc8.cu: the decode Q8_0 matrix-vector products on the integer tensor cores
// (matvec_tc8.cuh), exact (strict tier): x prepared once per vector (mvtc_prep_Q8_0), then dense,
// fused-SwiGLU and MoE products through matvec_tc.cuh's body (slots documented there).
#include "matvec_tc8.cuh"
#include "out_prep.cuh"

// Slots: p0 x (f32 rows of n_in), p1 xb, p2 xf. Grid (n_in / 256, rows of x), 32 threads (one warp
// per 256 inputs).
KERNEL void __launch_bounds__(32) mvtc_prep_Q8_0(const Args a) {
    mvtc8::prep_x_body(mvtc8::PrepArgs{reinterpret_cast<const float*>(a.p[0]), reinterpret_cast<uint32_t*>(a.p[1]),
                                       reinterpret_cast<float*>(a.p[2])});
}

// 16 R rows per block of 32 KW threads. dev/cuda/matvec_bench.cu on the H200 (4096-wide rows but
// ffn down), x prepared once, product alone under dependent launch. Every dense product
// double-buffers its weight loads (matvec_tc.cuh rows_db: 40 R registers more per lane, which the
// Q8_0 body, the least arithmetic per byte, pays back most): R = 2, KW = 4 from 8192 rows (qkv
// 13.3 -> 10.6 us, the LM head 312 -> 259), R = 2, KW = 8 from 4096 (4096 rows 9.2 -> 6.7, ffn
// down 21.6 -> 15.5), R = 1, KW = 8 below (1024 rows 3.8 -> 3.5) and for the products with experts.
// End to end (tg128, 9B Q8_0): 252.8 -> 286.6 t/s; 276.4 with the first step loaded after the wait
// (n11 bit 3 clear).
// The fused SwiGLU below 8192 rows: R = 1, KW = 8 (two matrices' loads), without the double
// buffer (one 12288-row matrix at that geometry: 17.8 -> 21.1).
KERNEL void __launch_bounds__(128) mvtc_tall_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 2, 4, false, true, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_mid_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 2, 8, false, true, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, false, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, true>(a);
    mvtc::glu_out_prep<16>(a);  // the down product's input (out_prep.cuh)
}
// The dense SwiGLU of 8192+ rows (formerly mvtc_glu_Q8_0), double-buffered, on blocks
// of 4 warps and 16 rows: 144 registers, three blocks per SM (at R = 2 the double buffer takes 255
// registers and spills, two blocks per SM: a 12288-row SwiGLU is 1.45 waves). H200 tg128 9B q8_0,
// one call: R = 2, KW = 4 without the double buffer 280.5 t/s, with it 288.6, R = 2, KW = 8 287.6,
// R = 1, KW = 4 291.7.
KERNEL void __launch_bounds__(128) mvtc_glu_tall_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 4, true, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);
}
// With a MoE layer's shared expert as one more expert per token (common.cuh MvShared).
KERNEL void __launch_bounds__(256) mvtc_sh_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_sh_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);  // the MoE down product's input (out_prep.cuh)
}
