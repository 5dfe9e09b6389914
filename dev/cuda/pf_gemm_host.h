// pf_gemm_host.h: host-side description of the GEMM kernels of kernels-cuda/gemm_q.cu, shared by
// the GPU harness and the CPU emulator checks (include after gemm_q.cu): the kernel table, their
// shared-memory sizes, tile shapes and the parameter blocks. No CUDA runtime calls.
#pragma once

namespace host {

typedef void (*GemmKernel)(pf::GemmParams);
struct CfgInfo {
    const char* name;
    int bm, bn, nth;
    double eff;  // assumed per-SM throughput relative to A (planner model only)
};
static const CfgInfo CFG[3] = {{"A128x256", 128, 256, 256, 1.0}, {"B128x128", 128, 128, 128, 0.9}, {"C32x128", 32, 128, 128, 0.5}};
static GemmKernel const KERN[NFMT][3] = {
    {pf_gemm_q4k_a, pf_gemm_q4k_b, pf_gemm_q4k_c}, {pf_gemm_q5k_a, pf_gemm_q5k_b, pf_gemm_q5k_c},
    {pf_gemm_q6k_a, pf_gemm_q6k_b, pf_gemm_q6k_c}, {pf_gemm_q80_a, pf_gemm_q80_b, pf_gemm_q80_c},
    {pf_gemm_f16_a, pf_gemm_f16_b, pf_gemm_f16_c}, {pf_gemm_bf16_a, pf_gemm_bf16_b, pf_gemm_bf16_c}};
#define PF_SMEM3(F) {pf::GemmCfg<pf::F, PF_CFG_A>::SMEM, pf::GemmCfg<pf::F, PF_CFG_B>::SMEM, pf::GemmCfg<pf::F, PF_CFG_C>::SMEM}
static const int SMEM[NFMT][3] = {PF_SMEM3(FMT_Q4K), PF_SMEM3(FMT_Q5K), PF_SMEM3(FMT_Q6K),
                                  PF_SMEM3(FMT_Q80), PF_SMEM3(FMT_F16), PF_SMEM3(FMT_BF16)};
#undef PF_SMEM3
static int rstep(int fmt) { return pf::FMT_CONSTS[fmt].rs; }

// 64-wide K steps per split (a whole number of raw super-steps); the split count is then
// ceil(nsteps / per), which may be fewer than asked.
static int steps_per_split(int fmt, int nsteps, int splits) {
    const int rs = rstep(fmt), per = (nsteps + splits - 1) / splits;
    return (per + rs - 1) / rs * rs;
}

// Dense product: y (rows x n) = W x; with `partials`, each of the splits writes its own
// rows x n plane there instead (pf_gemm_splitk_reduce sums them into y). x_lo: the lo plane of x
// (pf_f32_to_f16's `lo`), read by the split formats (F16, BF16) only; null for the others.
static pf::GemmParams gemm_params(const uint8_t* w, long long rb, const __half* x, const __half* x_lo, long long ldx,
                                  const int* xrows, float* y, int rows, int n, int k, int per, float* partials) {
    pf::GemmParams p{};
    p.w = w;
    p.x = x;
    p.x_lo = x_lo;
    p.x_rows = xrows;
    p.y = partials ? partials : y;
    p.row_bytes = rb;
    p.ldx = ldx;
    p.ldy = n;
    p.split_stride = partials ? (long long)rows * n : 0;
    p.rows = rows;
    p.n_out = n;
    p.k = k;
    p.steps_per_split = per;
    return p;
}
// Grouped (MoE) product over the device tile list; expert e's rows start at w + e * expert_bytes.
static pf::GemmParams grouped_params(const uint8_t* w, long long rb, long long expert_bytes, const __half* x,
                                     const __half* x_lo, long long ldx, const int* xrows, float* y, int n, int k,
                                     const int4* tiles, const int* num_tiles) {
    pf::GemmParams p = gemm_params(w, rb, x, x_lo, ldx, xrows, y, 0, n, k, k / 64, nullptr);
    p.expert_bytes = expert_bytes;
    p.tiles = tiles;
    p.num_tiles = num_tiles;
    return p;
}

}  // namespace host
