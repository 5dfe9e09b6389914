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
// ffn down), x prepared once: R = 1, KW = 8 below 8192 rows (4096 rows 9.2 us against the f32
// kernels' 10.4, 1024 rows 5.7, ffn down 21.0), R = 2, KW = 8 from 8192 rows (qkv 13.8 against
// 18.6; 14.8 with R = 1), R = 2, KW = 4 for the LM head (248K rows: 321 us against 392; 334 with
// KW = 8). The fused SwiGLU: R = 1, KW = 8 (two matrices' loads).
KERNEL void __launch_bounds__(128) mvtc_head_Q8_0(const Args a) { mvtc::mv_body<mvtc8::TcQ80, 2, 4, false, true>(a); }
KERNEL void __launch_bounds__(256) mvtc_tall_Q8_0(const Args a) { mvtc::mv_body<mvtc8::TcQ80, 2, 8, false, true>(a); }
KERNEL void __launch_bounds__(256) mvtc_Q8_0(const Args a) { mvtc::mv_body<mvtc8::TcQ80, 1, 8, false>(a); }
KERNEL void __launch_bounds__(256) mvtc_glu_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, true>(a);
    mvtc::glu_out_prep<16>(a);  // the down product's input (out_prep.cuh)
}
// The dense SwiGLU of 8192+ rows at R = 2, KW = 4, as Q4_K's (9B q8_0 tg128 236.2 -> 243.3 t/s on
// the H200; `RILL_CUDA_GLU_TALL=0`: mvtc_glu_Q8_0).
KERNEL void __launch_bounds__(128) mvtc_glu_tall_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 2, 4, true, true>(a);
    mvtc::glu_out_prep<32>(a);
}
// With a MoE layer's shared expert as one more expert per token (common.cuh MvShared).
KERNEL void __launch_bounds__(256) mvtc_sh_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, false, false, true>(a);
}
KERNEL void __launch_bounds__(256) mvtc_glu_sh_Q8_0(const Args a) {
    mvtc::mv_body<mvtc8::TcQ80, 1, 8, true, false, true>(a);
    mvtc::glu_out_prep<16>(a);  // the MoE down product's input (out_prep.cuh)
}
