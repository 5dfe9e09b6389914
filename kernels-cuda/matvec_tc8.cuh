// matvec_tc8.cuh: the decode Q8_0 matrix-vector product on the integer tensor cores, at the strict
// (f32-class) tier: the production kernels of matvec_tc8.cu (through matvec_tc.cuh's body, policy
// TcQ80), the candidate dev/cuda/matvec_bench.cu times, dev/cuda/emu/mvtc_checks.cpp's checks on
// the CPU emulator. Also the int8 pieces matvec_tc6.cuh (Q6_K) shares.
//
//   out[o] = sum_i W[o][i] * x[i],  W in Q8_0: w = d * q  (q int8, d f16 per block of 32; 34 bytes)
//
// Why int8 and not the f16 MMA of matvec_tc.cuh: d * q is not exact in f16, so an f16 MMA must
// stop at every block and the weights would still need a byte -> f16 decode (~1.3 instructions
// per weight). On mma.sync m16n8k32 s8.s8.s32 the quant bytes *are* the A operand (no decode),
// and the sums are exact integers:
//   * x per block of 32: s = 2^(29 - e) with max|x| in [2^e, 2^(e+1)) (e >= -97, so s and 1/s
//     are normal f32), X = rint(x s) (|X| < 2^30), split into four signed digits
//     X = D0 + 2^8 D1 + 2^16 D2 + 2^24 D3 (each in -128..127). The error is the rounding of x s:
//     <= 2^-31 max|x| of the block per element (f32 rounds each product to 2^-24 of itself; the
//     dot-product bound of the harness, 1e-5 sum|w x|, is met unless a block's largest |x|
//     meets a zero weight and the rest of the row is 2^20 times smaller).
//   * B columns n = 0..3 carry digit n of the even block of a block pair, columns 4..7 digit
//     n - 4 of the odd block (zero where the A byte belongs to the other block or is a d byte).
//     So every C entry is one block's one digit sum, exact in int32 (|C| <= 32 * 128 * 128).
//   * Per pair and lane (g, t), C holds rows g, g+8 x digits (2t, 2t+1) mod 4 of block
//     2P + (t >> 1): v = C0 + 256 C1 is exact in int32, rounded once to f32, then
//     acc += v * (d * 2^(16 (t & 1)) / s) in f32. The four lanes t of a row meet by shuffles.
//
// Loads and the k permutation. A group of 8 blocks (272 bytes = 17 x 16) of a row is 16-byte
// aligned (n_in % 256 == 0); pair P = global words 17P .. 17P+16 of the group (w0 = d, q0, q1;
// w8 = q30, q31, d'). Lane (g, t) loads pieces t, t+4, t+8, t+12 and 16 (five 16-byte loads,
// words r[0..19]): lanes 1..3 then hold exactly words 4t + k - P (k = 0..3) of pair P in
// r[4P + k]; lane 0 holds five words of each pair, r[4P + k] for k >= P, r[4P + 4 + k] for k < P
// (one SEL each, 6 per group and row) and r[5P + 4] (its fifth, the pair's last word). So a
// pair is two full MMAs (slots k = 0..3: a0/a2 of each) plus one with only lane 0's fifth word
// (a0/a1), which adds into the same C. Nothing is shuffled on the weight side; the prep kernel
// writes each lane's B words in exactly this order (24 words per lane and group, six 16-byte
// loads; (b0, b1) of every MMA an aligned register pair). d of the even block is the low half
// of lane 0's r[5P], d of the odd block the high half of lane 2's r[5P]; lanes 1 and 3 get it
// from lane 0 / 2 (one SHFL).
//
// Instructions per weight (per lane and group: 16 rows x 256 = 128 weights per lane and tile):
// 10 LDG.128 weights, 6 B + 1 scale LDG.128 shared by the R tiles, 12 SEL, 12 IMMA, and per pair
// 1 PRMT + 1 SHFL + 2 x (IMAD, I2F, f16->f32, FMUL, FFMA) = 48: ~0.65 per weight on paper. The
// SASS adds ~3 register moves per IMMA (A must be the quad {row g, row g+8, row g, row g+8} and
// a 16-byte load fills four registers of one row): nvcc 13.0, sm_90, main loop per group R=1
// KW=8 144 instructions = 1.13 per weight, R=2 KW=4/8 267-269 = 1.05 (the f32 kernels: ~4).
// Registers (-Xptxas -v, no spills): R=1 KW=8 86, R=2 KW=4 112, R=2 KW=8 114; prep_x 47.
//
// Two launches: mvtc8::prep_x (x -> B words and block scales, 3 KB per 256 inputs; one warp) and
// mvtc8::q80<R, KW> (a block of KW warps owns 16R rows; warp w takes groups w, w + KW, ...; the
// partial sums meet in shared memory in a fixed order). Requirements: n_in % 256 == 0, W 16-byte
// aligned. NaN or inf in a block of x makes its scale NaN: every output that reads it is NaN.
#pragma once

#include "matvec_tc.cuh"

namespace mvtc8 {

using mvtc::ld16;
using mvtc::shfl;

constexpr int G_WORDS = 32 * 24;  // B words per group of 256 inputs: 24 per lane (6 per pair)
constexpr int G_FACT = 16;        // scale floats per group: lane t, pair P at 4t + P

// ---------------------------------------------------------------------------------------------
// Shared int8 primitives (also used by matvec_tc6.cuh).

// d = a * b + c on m16n8k32, s8 x s8 -> s32 (fragments: pf_emu.h's mma_s8 states them).
#ifdef PF_EMU
static inline void mma_s8(int* d, const int* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                          uint32_t b1) {
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    ::pf_emu::mma_s8(d, c, a, b);
}
static inline float i2f(int v) { return (float)v; }
#else
static __device__ __forceinline__ void mma_s8(int* d, const int* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}
static __device__ __forceinline__ float i2f(int v) { return (float)v; }
#endif

// The power-of-two scale of a group of x with largest magnitude amax: s = 2^(29 - e) (so that
// |x s| < 2^30), e clamped to >= -97 (s <= 2^126); returns 1/s, NaN when amax is not finite
// (NaN or inf somewhere in the group), 1 for an all-zero group.
static __device__ __forceinline__ float digit_scale(float amax, float& s) {
    s = 1.0f;
    if (!(amax <= 3.4028235e38f)) return NAN;  // NaN compares false, inf is above
    if (amax == 0.0f) return 1.0f;
    const int e = max((int)((pf::f2u(amax) >> 23) & 0xff) - 127, -97);  // subnormals: e = -127 -> -97
    s = pf::u2f((uint32_t)(127 + 29 - e) << 23);
    return pf::u2f((uint32_t)(127 - 29 + e) << 23);
}
// X = rint(x s) as four signed base-256 digits, packed low digit first.
static __device__ __forceinline__ uint32_t digits(float x, float s, bool finite) {
    int v = finite ? (int)rintf(x * s) : 0;  // x s exact (power of two); |v| < 2^30
    uint32_t r = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int dg = (int)(int8_t)(uint8_t)(v & 0xff);
        r |= (uint32_t)(uint8_t)dg << (8 * k);
        v = (v - dg) >> 8;  // exact: v - dg is a multiple of 256
    }
    return r;
}

// ---------------------------------------------------------------------------------------------
// Prep (prep_grp_warp, below: one warp per group of 8 blocks of x), its layout:
//   xb[(group * 32 + lane) * 24 + 6P + j]: lane's B word j of pair P (j = 0, 1: b0, b1 of the
//   first MMA; 2, 3 of the second; 4, 5: of the third, b1 = 0), so that every (b0, b1) pair is
//   an aligned register pair straight from the loads (IMMA takes B as a register pair);
//   xf[group * 16 + 4t + P] = 2^(16 (t & 1)) / s of block 2P + (t >> 1) (NaN: non-finite x).
struct PrepArgs {
    const float* x;
    uint32_t* xb;
    float* xf;
};

// The register of lane t that feeds slot k (0..3: the two full MMAs' a0/a2; 4: the third) of
// pair P, and the group word it holds (see the top).
static __host__ __device__ __forceinline__ int slot_reg(int t, int P, int k) {
    if (k == 4) return 4 * (P + 1) + P;
    return (t == 0 && k < P) ? 4 * (P + 1) + k : 4 * P + k;
}
static __host__ __device__ __forceinline__ int reg_word(int t, int r) {
    return r < 16 ? 16 * (r / 4) + 4 * t + r % 4 : 48 + r;
}

// Shared memory a warp needs for prep_grp_warp: digit plane n of the group as the weights' bytes
// would hold it (272 bytes: 8 blocks of 34, the two d bytes of each zero).
constexpr int IMG_WORDS = 4 * 68;

// Eight consecutive floats at p (32-byte aligned) as two 16-byte loads. Plain loads, not the
// read-only path: a norm kernel prepares the row it has just written.
static __device__ __forceinline__ void ld8(const float* p, float (&v)[8]) {
#ifdef PF_EMU
    if (reinterpret_cast<uintptr_t>(p) % 32) ::pf_emu::fail("mvtc prep: misaligned x");
    memcpy(v, p, 32);
#else
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
#endif
}
static __device__ __forceinline__ void st16(uint32_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
#ifdef PF_EMU
    if (reinterpret_cast<uintptr_t>(p) % 16) ::pf_emu::fail("mvtc prep: misaligned 16-byte store");
    const uint32_t v[4] = {a, b, c, d};
    memcpy(p, v, 16);
#else
    *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
#endif
}
// |v| with NaN as inf (a non-finite block takes digit_scale's NaN branch), the max of the lane's 8.
static __device__ __forceinline__ float abs_max8(const float (&v)[8]) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = fabsf(v[k]);
        m = fmaxf(m, a != a ? INFINITY : a);
    }
    return m;
}

// One group of 256 values of x (at x_g, 32-byte aligned) prepared by one warp, lane l holding
// elements 8l .. 8l+7 (block l / 4): its B words into xb_g, its factors into xf_g. `img`:
// IMG_WORDS of shared memory of this warp alone. No block barrier, so any warp of any kernel can
// prepare a group. The digits go into img as the weights' byte image (plane n: digit n of
// element e of block b at byte 34 b + 2 + e); then every B word is one aligned word of a plane,
// kept where its bytes belong to the lane's column block (see the top). The result is the same,
// bit for bit, as the former 256-thread prep kernel's (dev/cuda/emu/mvtc_checks.cpp keeps it).
static __device__ __forceinline__ void prep_grp_warp(const float* x_g, uint32_t* xb_g, float* xf_g, uint32_t* img) {
    const int l = threadIdx.x & 31, blk = l >> 2;
    float v[8];
    ld8(x_g + 8 * l, v);
    float m = abs_max8(v);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // the four lanes of a block
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    float s;
    const float inv_s = digit_scale(m, s);
    uint32_t dg[8];
#pragma unroll
    for (int k = 0; k < 8; k++) dg[k] = digits(v[k], s, inv_s == inv_s);
    // Elements 8l + 2i, 8l + 2i + 1 of the group at byte 34 blk + 2 + 8 (l & 3) + 2i: always even.
    uint16_t* img16 = reinterpret_cast<uint16_t*>(img);
    const int base = 17 * blk + 1 + 4 * (l & 3);  // in halfwords
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            img16[n * 136 + base + i] = (uint16_t)pf::prmt(dg[2 * i], dg[2 * i + 1], (uint32_t)(n | (n + 4) << 4));
        if ((l & 3) == 0) img16[n * 136 + 17 * blk] = 0;  // the block's d bytes
    }
    __syncwarp();
    // Lane (n, t)'s 24 words: digit n & 3, column block 2P + (n >> 2).
    const int t = l & 3, n = l >> 2;
    const uint32_t* plane = img + (n & 3) * 68;
    uint32_t w[24];
#pragma unroll
    for (int P = 0; P < 4; P++)
#pragma unroll
        for (int k = 0; k < 6; k++) {
            uint32_t val = 0;
            if (k < 4 || (k == 4 && t == 0)) {  // the third MMA: only lane 0's word (the others' are duplicates)
                const int gw = reg_word(t, slot_reg(t, P, k));
                // Words 0..8 of the pair hold the even block (word 8: its last two elements, then
                // the odd block's d bytes, zero), words 9..16 the odd one.
                if ((gw - 17 * P >= 9) == (n >= 4)) val = plane[gw];
            }
            w[6 * P + k] = val;
        }
    uint32_t* dst = xb_g + l * 24;
#pragma unroll
    for (int i = 0; i < 6; i++) st16(dst + 4 * i, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    // Factor i = 4t + P (lanes i < 16): 1/s of block 2P + (t >> 1), held by lanes 4 (2P + (t >> 1)) + 0..3.
    const int fi = l & 15, ft = fi >> 2, fp = fi & 3;
    const float f = pf::u2f(shfl(pf::f2u(inv_s), 4 * (2 * fp + (ft >> 1))));
    if (l < 16) xf_g[fi] = f * ((ft & 1) ? 65536.0f : 1.0f);
    __syncwarp();  // img is read before this warp's next group writes it
}

// The prep kernel: one warp per group (blocks of 32 threads, grid.x = n_in / 256), grid.y = rows
// of x (row y at x + y n_in, its words and factors at y times a row's share).
static __device__ __forceinline__ void prep_x_body(const PrepArgs& p) {
    __shared__ uint32_t img[IMG_WORDS];
    const size_t grp = (size_t)blockIdx.y * gridDim.x + blockIdx.x;  // group index over all rows
    pf::pdl_wait();
    prep_grp_warp(p.x + grp * 256, p.xb + grp * G_WORDS, p.xf + grp * G_FACT, img);
}

// ---------------------------------------------------------------------------------------------
// The product.
struct Args {
    const uint8_t* w;
    const uint32_t* xb;
    const float* xf;
    float* out;
    int n_out, n_in;
    size_t row_bytes;
};

// One group's weights of the block's 2R rows as lane (g, t) reads them: five 16-byte pieces per
// row (t, t + 4, t + 8, t + 12 and 16), words r[0..19] of the top.
template <int R>
struct Q80Weights {
    uint32_t wq[2 * R][20];
};
template <int R>
static __device__ __forceinline__ void q80_load(const uint8_t* const (&rows)[2 * R], int grp, Q80Weights<R>& w) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        const uint8_t* b = rows[r] + (size_t)grp * 272;
#pragma unroll
        for (int i = 0; i < 5; i++) {
            const uint4 v = ld16(b + 16 * (i < 4 ? t + 4 * i : 16));
            w.wq[r][4 * i] = v.x;
            w.wq[r][4 * i + 1] = v.y;
            w.wq[r][4 * i + 2] = v.z;
            w.wq[r][4 * i + 3] = v.w;
        }
    }
}

// The arithmetic of group grp once its weights are in registers: the x words' loads, the MMAs and
// acc += v * d / s per block.
template <int R>
static __device__ __forceinline__ void q80_math(const Q80Weights<R>& w, int grp, const uint32_t* xbp, const float* xf,
                                                float (&acc)[2 * R]) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    // lanes 0, 2 pack their d halves (even block: low, odd block: high) as {row g, row g+8}
    const uint32_t dsel = (t & 2) ? 0x7632u : 0x5410u;
    const int zero[4] = {0, 0, 0, 0};
    uint32_t xb[24];
    const uint32_t* src = xbp + ((size_t)grp * 32 + lane) * 24;
#pragma unroll
    for (int i = 0; i < 6; i++) {
        const uint4 v = ld16(src + 4 * i);
        xb[4 * i] = v.x;
        xb[4 * i + 1] = v.y;
        xb[4 * i + 2] = v.z;
        xb[4 * i + 3] = v.w;
    }
    const uint4 fq = ld16(xf + (size_t)grp * G_FACT + 4 * t);
    const float fp[4] = {pf::u2f(fq.x), pf::u2f(fq.y), pf::u2f(fq.z), pf::u2f(fq.w)};

#pragma unroll
    for (int rt = 0; rt < R; rt++) {
        const uint32_t(&wa)[20] = w.wq[2 * rt];
        const uint32_t(&wb)[20] = w.wq[2 * rt + 1];
#pragma unroll
        for (int P = 0; P < 4; P++) {
            uint32_t sa[4], sb[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                sa[k] = k < P && t == 0 ? wa[4 * (P + 1) + k] : wa[4 * P + k];
                sb[k] = k < P && t == 0 ? wb[4 * (P + 1) + k] : wb[4 * P + k];
            }
            int c[4];
            mma_s8(c, zero, sa[0], sb[0], sa[1], sb[1], xb[6 * P], xb[6 * P + 1]);
            mma_s8(c, c, sa[2], sb[2], sa[3], sb[3], xb[6 * P + 2], xb[6 * P + 3]);
            mma_s8(c, c, wa[5 * P + 4], wb[5 * P + 4], 0u, 0u, xb[6 * P + 4], xb[6 * P + 5]);
            // d of this lane's block for rows g (low half) and g + 8 (high half).
            const uint32_t dd = shfl(pf::prmt(wa[5 * P], wb[5 * P], dsel), lane & ~1);
            const float va = i2f(c[0] + c[1] * 256), vb = i2f(c[2] + c[3] * 256);
            acc[2 * rt] = fmaf(va, pf::h2f(dd & 0xffffu) * fp[P], acc[2 * rt]);
            acc[2 * rt + 1] = fmaf(vb, pf::h2f(dd >> 16) * fp[P], acc[2 * rt + 1]);
        }
    }
}

// The format policy of the production body (matvec_tc.cuh mv_body, TcQ4K there says what it holds).
struct TcQ80 {
    static constexpr int WORDS = G_WORDS, SUMS = G_FACT;
    static constexpr int SEGS = MV_SEGS;
    static constexpr bool ANY_FIRST = true;
    template <int R, int KW, bool XS = false>
    static __device__ __forceinline__ void rows(const uint8_t* const (&w)[2 * R], const uint32_t* xb, const float* xf,
                                                int ngrp, int first, int step, float (&part)[2 * R]) {
        static_assert(!XS, "x in global memory only");
        mvtc::rows_plain<TcQ80, R>(w, xb, xf, ngrp, first, step, part);
    }
    // One group's loads and its arithmetic (matvec_tc.cuh rows_plain, rows_db).
    template <int R>
    using W = Q80Weights<R>;
    template <int R>
    struct Acc {
        float a[2 * R];
    };
    template <int R>
    static __device__ __forceinline__ void load(const uint8_t* const (&w)[2 * R], int grp, W<R>& v) {
        q80_load<R>(w, grp, v);
    }
    template <int R>
    static __device__ __forceinline__ void zero(Acc<R>& c) {
#pragma unroll
        for (int r = 0; r < 2 * R; r++) c.a[r] = 0.0f;
    }
    template <int R>
    static __device__ __forceinline__ void math(const W<R>& v, int grp, const uint32_t* xb, const float* xf, Acc<R>& c) {
        q80_math<R>(v, grp, xb, xf, c.a);
    }
    template <int R>
    static __device__ __forceinline__ float result(const Acc<R>& c, int r) {
        return c.a[r];
    }
};

// The candidate of dev/cuda/matvec_bench.cu: one dense product, out = W x.
template <int R, int KW>
static __device__ __forceinline__ void q80_body(const Args& p) {
    const int row0 = blockIdx.x * 16 * R, ngrp = p.n_in / 256;
    const uint8_t* rows[2 * R];
    mvtc::row_ptrs<R>(p.w, row0, p.n_out, p.row_bytes, rows);
    float part[2 * R];
    pf::pdl_wait();
    TcQ80::rows<R, KW>(rows, p.xb, p.xf, ngrp, (int)(threadIdx.x >> 5), KW, part);
    mvtc::bench_store<R, KW>(part, row0, p.n_out, p.out);
}

#if !defined(PF_EMU) && defined(MVTC_BENCH_KERNELS)
// The harness's kernels (dev/cuda/matvec_bench.cu defines MVTC_BENCH_KERNELS).
static __global__ void __launch_bounds__(32) prep_x(const PrepArgs p) { prep_x_body(p); }
template <int R, int KW>
static __global__ void __launch_bounds__(32 * KW) q80(const Args p) {
    q80_body<R, KW>(p);
}
#endif

}  // namespace mvtc8
