// matvec_tc.cuh: the decode Q4_K matrix-vector product on the tensor cores, at the strict
// (f32-class) tier, and the production body (mv_body) every format's kernels share (Q8_0, Q6_K:
// matvec_tc8.cuh, matvec_tc6.cuh). The kernels of matvec_tc.cu (dense, fused SwiGLU, MoE experts)
// and the candidates of dev/cuda/matvec_bench.cu share it; dev/cuda/emu/mvtc_checks.cpp runs it
// on the CPU emulator.
//
//   out[o] = sum_i W[o][i] * x[i],  W in Q4_K: w = d * sc_j * q - dmin * m_j  (q 0..15, sc, m 0..63)
//
// Why: the f32 kernels spend ~3.5 instructions per weight (byte -> float, FMA) and are issue-bound
// well below the H200's bandwidth (dev/cuda/DECISIONS.md). Here 8 quants cost 9 instructions (one
// shift, four LOP3, four HFMA2) plus 2 mma.sync for the arithmetic, and nothing is rounded:
//   * sc_j * q <= 945 is an integer, exact in f16. The B fragment (16 k x 8 weight rows) is built
//     from the nibbles with the 0x6400 trick: (0x6400 | q) is the f16 1024 + q; one fused
//     HFMA2 (1024 + q) * sc - 1024 * sc gives q * sc exactly (high nibbles: mask 0x00F0 gives
//     1024 + 16 q, times sc / 16 minus 64 sc). fma.rn.f16x2 rounds once, and the result is exact.
//   * x is split per super-block of 256 into three f16 terms: s = 2^(14 - e) with max|x| in
//     [2^e, 2^(e+1)) puts max|x s| in [2^14, 2^15); hi = f16(x s), mid = f16(x s - hi),
//     lo = f16(x s - hi - mid). hi + mid + lo == x s exactly where |x s| >= 1/2 (f16 normal
//     range covers the 24 bits); below that the error is <= 2^-25 / s <= 2^-39 max|x| of the
//     super-block, far under the f32 tier. The three terms are rows 0, 1, 2 of the A fragment
//     (rows 3..15 zero): one MMA computes all three partial dot products of 128 weights.
//   * The products q sc x_term are exact in the MMA, the sums f32 (tensor-core accumulation).
//     C accumulates the 8 MMAs of one nibble half of a super-block (two chains per 8-row tile,
//     also for latency), then acc += C * (d / s) in f32; the min term dmin * sum_j m_j S_j
//     (S_j = sum of x over sub-block j, from the prep kernel, an f32 shuffle tree) in
//     f32 on the B side, as the f32 kernels factor it.
//
// Fragment layout (PTX m16n8k16, g = lane / 4, t = lane % 4; kernels-cuda/pf_common.cuh):
//   B: lane (g, t) supplies weight row g of the 8-row tile, k = 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1).
//   A dot product does not care about k order, so lane (g, t) supplies the quants of chunk c = t
//   of the super-block (qs bytes 32c .. 32c+32: elements l of sub-block 2c in the low nibbles,
//   sub-block 2c+1 in the high nibbles): per 32-bit word (elements l .. l+3), b0 = (q[l], q[l+2])
//   and b1 = (q[l+1], q[l+3]) from the low nibbles feed one MMA, the high nibbles another. An MMA
//   thus mixes four sub-blocks (its B carries their scales). The prep kernel writes x in the same
//   permutation as ready A words: lane (m, t) (m < 3) loads its 32 words with eight 16-byte loads.
//   C: lane (g, t) holds term g (g < 3) of weight rows 2t, 2t+1.
//
// Work split: a block of KW warps owns 8R rows; warp w takes super-blocks w, w + KW, ... of all
// R row tiles (per super-block and lane: R x (one 16-byte header + two 16-byte quant loads), all
// issued before the math), and the KW partial sums meet in shared memory in a fixed order.
//
// Two launches: mvtc_prep_x (x -> A words and sums, 1.6 KB per 256 inputs; one per x, reusable by
// every product that reads the same x) and mvtc_q4k. Requirements: n_in % 256 == 0, W 16-byte
// aligned (rows are 144 * n_in / 256 bytes: every super-block stays 16-byte aligned).
#pragma once

#include "pf_common.cuh"
// The production kernels' Args (with the segment table), kernel_start, prefetch_l2, siluf_,
// MvShared; after pf_common.cuh, which brings the emulator's CUDA names under PF_EMU
// (mvtc_checks.cpp runs mv_body).
#include "common.cuh"

namespace mvtc {

constexpr int SB_WORDS = 4 * 3 * 32;  // A words per super-block: 4 chunks x 3 terms x 32
constexpr int SB_SUMS = 16;           // floats per super-block: S_0..S_7, 1/s, padding

// ---------------------------------------------------------------------------------------------
// Primitives (the emulator's versions check what the design relies on).

#ifdef PF_EMU
static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {
        const double v = (double)pf::h2f((a >> (16 * h)) & 0xffffu) * pf::h2f((b >> (16 * h)) & 0xffffu) +
                         pf::h2f((c >> (16 * h)) & 0xffffu);
        const __half_raw o = __half(__double2half(v));
        // The design: every HFMA2 here has an exactly representable result.
        if ((double)pf::h2f(o.x) != v) ::pf_emu::fail("mvtc: inexact hfma2");
        r |= (uint32_t)o.x << (16 * h);
    }
    return r;
}
static inline uint32_t shfl(uint32_t v, int src) { return ::pf_emu::exchange(v, src); }
template <uint32_t MASK>
static inline uint32_t nib_f16(uint32_t w) {
    return (w & MASK) | 0x64006400u;
}
static inline uint4 ld16(const void* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16) ::pf_emu::fail("mvtc: misaligned 16-byte load");
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
static inline void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    ::pf_emu::mma_f16(c, a, b);
}
#else
static __device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
static __device__ __forceinline__ uint32_t shfl(uint32_t v, int src) { return __shfl_sync(0xffffffffu, v, src); }
// (w & MASK) | 0x64006400 as one LOP3 (written in C++, the compiler emits an AND and an OR: SASS
// LOP3 takes one immediate, so the magic must sit in a register).
template <uint32_t MASK>
static __device__ __forceinline__ uint32_t nib_f16(uint32_t w) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "r"(0x64006400u));
    return r;
}
static __device__ __forceinline__ uint4 ld16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
static __device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

static __device__ __forceinline__ uint16_t f2h_bits(float v) {
    const __half_raw r = __half(__float2half_rn(v));
    return r.x;
}

// 16 bytes of prepared x: from global memory (ld16: the read-only path), or with XS from the
// shared memory a NORM kernel prepared it in (mv_body), where ld16's global load cannot go.
template <bool XS>
static __device__ __forceinline__ uint4 ldx16(const uint32_t* p) {
    if constexpr (XS)
        return *reinterpret_cast<const uint4*>(p);
    else
        return ld16(p);
}

// ---------------------------------------------------------------------------------------------
// Prep (prep_sb_warp, below: one warp per super-block of x), its layout:
//   xa[((sb * 4 + c) * 3 + m) * 32 + word]: the A words of lane (m, t = c), word 4w + {0: a0 low
//   nibbles, 1: a2 low, 2: a0 high, 3: a2 high} for the quant word w of chunk c;
//   xs[sb * 16 + j] = S_j (j < 8), xs[sb * 16 + 8] = 1 / s.
struct PrepArgs {
    const float* x;
    uint32_t* xa;
    float* xs;
};

// One super-block of x (256 values at x_sb) prepared by one warp, lane l holding elements
// l + 32 k (k = 0..7, i.e. element l of sub-block k): its A words into xa_sb, the sub-block sums
// S_k (f32, a fixed shuffle tree: f32-class like every f32 kernel's sums) and 1/s into xs_sb. No
// shared memory and no barrier, so any warp of any kernel can prepare a super-block.
static __device__ __forceinline__ void prep_sb_warp(const float* x_sb, uint32_t* xa_sb, float* xs_sb) {
    const int l = threadIdx.x & 31;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = x_sb[32 * k + l];
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = fabsf(v[k]);
        m = fmaxf(m, a != a ? INFINITY : a);  // NaN: take the non-finite branch below
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // s = 2^(14 - e), 1/s = 2^(e - 14), e = floor(log2(amax)) clamped to [-112, 127] (both normal).
    float s = 1.0f, inv_s = 1.0f;
    if (m > 0.0f && m <= 3.4028235e38f) {
        const int e = max((int)((pf::f2u(m) >> 23) & 0xff) - 127, -112);
        s = pf::u2f((uint32_t)(127 + 14 - e) << 23);
        inv_s = pf::u2f((uint32_t)(127 - 14 + e) << 23);
    }
    // Element i = 32 k + l = 64 c + 32 half + 4 w + pos: c = k / 2, half = k % 2, w = l / 4, pos = l % 4.
    const int w = l >> 2, pos = l & 3, upper = pos >> 1;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float xv = v[k] * s;  // exact (power of two, in range)
        const uint16_t hi = f2h_bits(xv);
        const float r1 = xv - pf::h2f(hi);
        const uint16_t mid = f2h_bits(r1);
        const uint16_t lo = f2h_bits(r1 - pf::h2f(mid));
        const int word = 4 * w + 2 * (k & 1) + (pos & 1);
        uint16_t* dst = reinterpret_cast<uint16_t*>(xa_sb + (k >> 1) * 96);
        dst[(0 * 32 + word) * 2 + upper] = hi;
        dst[(1 * 32 + word) * 2 + upper] = mid;
        dst[(2 * 32 + word) * 2 + upper] = lo;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float t = v[k];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (l == k) xs_sb[k] = t;
    }
    if (l == 8) xs_sb[8] = inv_s;
}

// The prep kernel: one warp per super-block (blocks of 32 threads, grid.x = n_in / 256), grid.y =
// rows of x (row y at x + y n_in, its words and sums at y times a row's share).
static __device__ __forceinline__ void prep_x_body(const PrepArgs& p) {
    const int nsb = gridDim.x;
    const size_t sb = (size_t)blockIdx.y * nsb + blockIdx.x;  // super-block index over all rows
    pf::pdl_wait();
    prep_sb_warp(p.x + sb * 256, p.xa + sb * SB_WORDS, p.xs + sb * SB_SUMS);
}

// ---------------------------------------------------------------------------------------------
// The product.
struct Args {
    const uint8_t* w;
    const uint32_t* xa;
    const float* xs;
    float* out;
    int n_out, n_in;
    size_t row_bytes;
};

// The decode of one quant word's nibbles into the f16 products q * sc (see the top).
struct K4Scales {
    uint32_t sc_lo, add_lo, sc_hi, add_hi;  // half2 {sc, sc}, {-1024 sc}, {sc / 16}, {-64 sc}
    float m0, m1;                            // dmin * m of sub-blocks 2t and 2t+1
};
// Scales and mins of sub-blocks 2t (low nibbles) and 2t+1 (high nibbles) from a super-block header.
static __device__ __forceinline__ K4Scales k4_scales(const uint4& hd, int t) {
    const uint32_t ONE = 0x3C003C00u, M1024 = 0xE400E400u, SIXTEENTH = 0x2C002C00u, M64 = 0xD400D400u;
    const int sh = 16 * (t & 1);
    const uint32_t s1w = hd.y >> sh, s2w = hd.z >> sh, s3w = hd.w >> sh;
    const uint32_t sc2 = t < 2 ? (s1w & 0x3F3Fu) : ((s3w & 0x0F0Fu) | ((s1w >> 2) & 0x3030u));
    const uint32_t m2 = t < 2 ? (s2w & 0x3F3Fu) : (((s3w >> 4) & 0x0F0Fu) | ((s2w >> 2) & 0x3030u));
    K4Scales k;
    k.sc_lo = hfma2(pf::prmt(sc2, 0x64u, 0x4040u), ONE, M1024);      // (1024 + sc) - 1024
    k.add_lo = hfma2(k.sc_lo, M1024, 0u);                             // -1024 sc
    k.sc_hi = hfma2(pf::prmt(sc2, 0x64u, 0x4141u), SIXTEENTH, M64);  // (1024 + sc) / 16 - 64
    k.add_hi = hfma2(k.sc_hi, M1024, 0u);                             // -64 sc
    // dmin m first: m S can overflow where dmin m S does not.
    const float dmin = pf::h2f(hd.x >> 16);
    k.m0 = dmin * (float)(m2 & 0xffu);
    k.m1 = dmin * (float)((m2 >> 8) & 0xffu);
    return k;
}
// Quant word w (elements l .. l+3 of sub-blocks 2t, 2t+1) as two A-fragment halves:
// lo = {q[l], q[l+2]} sc, {q[l+1], q[l+3]} sc (low nibbles), hi the same for the high nibbles.
static __device__ __forceinline__ void k4_word(uint32_t w, const K4Scales& k, uint32_t& lo0, uint32_t& lo1,
                                               uint32_t& hi0, uint32_t& hi1) {
    const uint32_t u = w >> 8;
    lo0 = hfma2(nib_f16<0x000F000Fu>(w), k.sc_lo, k.add_lo);
    lo1 = hfma2(nib_f16<0x000F000Fu>(u), k.sc_lo, k.add_lo);
    hi0 = hfma2(nib_f16<0x00F000F0u>(w), k.sc_hi, k.add_hi);
    hi1 = hfma2(nib_f16<0x00F000F0u>(u), k.sc_hi, k.add_hi);
}

// Weights are the A operand (16 rows x 16 k: lane (g, t) supplies rows g and g+8), the x terms
// the B operand (16 k x 8 columns: columns 0, 1, 2 = hi, mid, lo, 3..7 zero; lane (g, t) with
// g < 3 supplies term g). C: lane (g, t) holds rows g, g+8 x terms 2t, 2t+1 (t < 2 useful).
//
// One super-block's weights of the block's 2R rows, as lane (g, t) reads them: per row the
// 16-byte header and the two 16-byte quant words of chunk t.
template <int R>
struct Q4KWeights {
    uint4 hd[2 * R], q0[2 * R], q1[2 * R];
};
template <int R>
static __device__ __forceinline__ void q4k_load(const uint8_t* const (&rows)[2 * R], int sb, Q4KWeights<R>& w) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        const uint8_t* b = rows[r] + (size_t)sb * 144;
        w.hd[r] = ld16(b);
        w.q0[r] = ld16(b + 16 + 32 * t);
        w.q1[r] = ld16(b + 32 + 32 * t);
    }
}

// The arithmetic of super-block sb once its weights are in registers: the x words' loads (XS:
// from shared memory, ldx16), the MMAs, acc += C * d / s and the min terms.
template <int R, bool XS = false>
static __device__ __forceinline__ void q4k_math(const Q4KWeights<R>& w, int sb, const uint32_t* xa, const float* xs,
                                                float (&acc)[2 * R], float (&macc)[2 * R]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4(&hd)[2 * R] = w.hd;
    const uint4(&q0)[2 * R] = w.q0;
    const uint4(&q1)[2 * R] = w.q1;
    uint32_t xb[32];
    if (g < 3) {
        const uint32_t* src = xa + (size_t)sb * SB_WORDS + (t * 3 + g) * 32;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint4 v = ldx16<XS>(src + 4 * k);
            xb[4 * k] = v.x;
            xb[4 * k + 1] = v.y;
            xb[4 * k + 2] = v.z;
            xb[4 * k + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < 32; k++) xb[k] = 0u;
    }
    const float s0 = xs[(size_t)sb * SB_SUMS + 2 * t], s1 = xs[(size_t)sb * SB_SUMS + 2 * t + 1];
    const float inv_s = xs[(size_t)sb * SB_SUMS + 8];

#pragma unroll
    for (int r = 0; r < R; r++) {
        const int ra = 2 * r, rb = 2 * r + 1;  // rows g and g + 8 of tile r
        const K4Scales ka = k4_scales(hd[ra], t), kb = k4_scales(hd[rb], t);
        const uint32_t wa[8] = {q0[ra].x, q0[ra].y, q0[ra].z, q0[ra].w, q1[ra].x, q1[ra].y, q1[ra].z, q1[ra].w};
        const uint32_t wb[8] = {q0[rb].x, q0[rb].y, q0[rb].z, q0[rb].w, q1[rb].x, q1[rb].y, q1[rb].z, q1[rb].w};
        float cl[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t la0, la1, ha0, ha1, lb0, lb1, hb0, hb1;
            k4_word(wa[k], ka, la0, la1, ha0, ha1);
            k4_word(wb[k], kb, lb0, lb1, hb0, hb1);
            mma(cl, la0, lb0, la1, lb1, xb[4 * k], xb[4 * k + 1]);
            mma(ch, ha0, hb0, ha1, hb1, xb[4 * k + 2], xb[4 * k + 3]);
        }
        const float fa = pf::h2f(hd[ra].x & 0xffffu) * inv_s, fb = pf::h2f(hd[rb].x & 0xffffu) * inv_s;
        acc[ra] = fmaf((cl[0] + ch[0]) + (cl[1] + ch[1]), fa, acc[ra]);
        acc[rb] = fmaf((cl[2] + ch[2]) + (cl[3] + ch[3]), fb, acc[rb]);
        macc[ra] += fmaf(ka.m1, s1, ka.m0 * s0);
        macc[rb] += fmaf(kb.m1, s1, kb.m0 * s0);
    }
}

// One weight matrix's share of this warp (F::rows, for the policies with a load / math split):
// steps first, first + step, ... (the warp index and KW unless a MoE sum splits its warps over
// entries: mv_body) of the 2R rows w[r] (rows 8r + g of the block: tile r / 2, half r % 2),
// against the prepared x of one vector (xa, xs at its first unit); each step's weight loads are all
// issued before its arithmetic. Sets part[r] to the lane's partial dot product of row 8r + g.
template <class F, int R>
static __device__ __forceinline__ void rows_plain(const uint8_t* const (&w)[2 * R], const uint32_t* xa,
                                                  const float* xs, int n, int first, int step, float (&part)[2 * R]) {
    typename F::template Acc<R> c;
    F::template zero<R>(c);
    for (int i = first; i < n; i += step) {
        typename F::template W<R> v;
        F::template load<R>(w, i, v);
        F::template math<R>(v, i, xa, xs, c);
    }
#pragma unroll
    for (int r = 0; r < 2 * R; r++) part[r] = F::template result<R>(c, r);
}

// The format policy of the production body (mv_body, below; matvec_tc8.cuh and matvec_tc6.cuh
// have one each): the prepared x's A/B words and f32 sums per 256 inputs, the products a plain
// launch may hold (SEGS: the segment table, common.cuh), whether a warp can start at any
// super-block (ANY_FIRST: mv_body may then split a MoE sum's warps over its entries), and `rows`,
// one weight matrix's share of the warp (super-blocks first, first + step, ...): sets part[r] to
// the lane's partial dot product of row 8r + g (the block's 2R rows, as rows_plain takes them;
// the four lanes t of a row add up to the row's value).
struct TcQ4K {
    static constexpr int WORDS = SB_WORDS, SUMS = SB_SUMS;
    static constexpr int SEGS = MV_SEGS;  // products per launch (common.cuh's segment table)
    static constexpr bool ANY_FIRST = true;
    // XS: x prepared in shared memory (mv_body NORM).
    template <int R, int KW, bool XS = false>
    static __device__ __forceinline__ void rows(const uint8_t* const (&w)[2 * R], const uint32_t* xa, const float* xs,
                                                int nsb, int first, int step, float (&part)[2 * R]) {
        // rows_plain's loop, written out: nvcc allocates the SwiGLU kernels' registers differently
        // for small changes of this body (ptxas -v; mvtc_glu_sh_Q4_K must stay at five blocks per SM).
        float acc[2 * R], macc[2 * R];
#pragma unroll
        for (int r = 0; r < 2 * R; r++) acc[r] = macc[r] = 0.0f;
        for (int sb = first; sb < nsb; sb += step) {
            Q4KWeights<R> v;
            q4k_load<R>(w, sb, v);
            q4k_math<R, XS>(v, sb, xa, xs, acc, macc);
        }
#pragma unroll
        for (int r = 0; r < 2 * R; r++) part[r] = acc[r] - macc[r];
    }
    // One super-block's loads and its arithmetic (rows_plain, and rows_db below).
    template <int R>
    using W = Q4KWeights<R>;
    template <int R>
    struct Acc {
        float a[2 * R], m[2 * R];
    };
    template <int R>
    static __device__ __forceinline__ void load(const uint8_t* const (&w)[2 * R], int sb, W<R>& v) {
        q4k_load<R>(w, sb, v);
    }
    template <int R>
    static __device__ __forceinline__ void zero(Acc<R>& c) {
#pragma unroll
        for (int r = 0; r < 2 * R; r++) c.a[r] = c.m[r] = 0.0f;
    }
    template <int R>
    static __device__ __forceinline__ void math(const W<R>& v, int sb, const uint32_t* xa, const float* xs, Acc<R>& c) {
        q4k_math<R>(v, sb, xa, xs, c.a, c.m);
    }
    template <int R>
    static __device__ __forceinline__ float result(const Acc<R>& c, int r) {
        return c.a[r] - c.m[r];
    }
    // One super-block of x (256 floats at x_sb) into this layout, by one warp (mv_body NORM).
    static __device__ __forceinline__ void prep(const float* x_sb, uint32_t* xa_sb, float* xs_sb) {
        prep_sb_warp(x_sb, xa_sb, xs_sb);
    }
};

// F::rows with the next step's weights loaded into registers before this step's arithmetic (a
// double buffer), so a warp keeps loads in flight while it computes: the loop of F::rows issues a
// step's loads and then waits for them, idle on the memory system during its arithmetic. The sums
// are the same, in the same order (bit for bit F::rows). `cur` is the buffer of the step in hand;
// `loaded`: it already holds the first step's weights (mv_body loads them before the
// dependent-launch wait, or the previous matrix's last step did). `next` (when `has_next`): the
// rows of the matrix that follows (a SwiGLU's up after its gate), whose first step is loaded during
// this matrix's last arithmetic; returns whether `cur` then holds it. A reference, not a pointer
// that may be null: a buffer reached through a run-time pointer lands in local memory (ptxas -v: a
// stack frame). Costs one step's weight registers per lane (Q4_K 24 R, Q8_0 40 R); matvec_bench's
// `tcD` variants measured it per shape (dev/cuda/DECISIONS.md).
template <class F, int R>
static __device__ __forceinline__ bool rows_db(const uint8_t* const (&w)[2 * R], const uint32_t* xa, const float* xs,
                                               int n, int first, int step, float (&part)[2 * R],
                                               typename F::template W<R>& cur, bool loaded,
                                               const uint8_t* const (&next)[2 * R], bool has_next) {
    typename F::template Acc<R> c;
    F::template zero<R>(c);
    if (first < n && !loaded) F::template load<R>(w, first, cur);
    for (int i = first; i < n; i += step) {
        typename F::template W<R> nxt;
        if (i + step < n) F::template load<R>(w, i + step, nxt);
        else if (has_next) F::template load<R>(next, first, nxt);
        F::template math<R>(cur, i, xa, xs, c);
        cur = nxt;
    }
#pragma unroll
    for (int r = 0; r < 2 * R; r++) part[r] = F::template result<R>(c, r);
    return has_next && first < n;
}

// Row pointers of the block's 2R rows (8r + g) of the matrix at w, any format; rows past the end
// repeat the last row (loads stay in bounds; their sums are never stored).
template <int R>
static __device__ __forceinline__ void row_ptrs(const uint8_t* w, int row0, int n_out, size_t row_bytes,
                                                    const uint8_t* (&rows)[2 * R]) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) rows[r] = w + (size_t)min(row0 + 8 * r + g, n_out - 1) * row_bytes;
}

// Lane sums of row 8r + g over the four lanes t (terms 2t, 2t+1; exact zeros for t >= 2).
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// The end of a harness body (dev/cuda/matvec_bench.cu, the emulator checks): the lanes' partial
// sums acc of rows 8r + g summed over the four lanes t, then over the KW warps in a fixed order,
// into out[row0 + i].
template <int R, int KW>
static __device__ __forceinline__ void bench_store(const float (&acc)[2 * R], int row0, int n_out, float* out) {
    static_assert(32 * KW >= 16 * R, "one thread per row for the final sum");
    __shared__ float red[KW][16 * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        const float v = quad_sum(acc[r]);
        if (t == 0) red[warp][8 * r + g] = v;
    }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < 16 * R && row0 + i < n_out) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; w++) v += red[w][i];
        out[row0 + i] = v;
    }
}

// The candidate of dev/cuda/matvec_bench.cu: one dense product, out = W x.
template <int R, int KW>
static __device__ __forceinline__ void q4k_body(const Args& p) {
    const int row0 = blockIdx.x * 16 * R, nsb = p.n_in / 256;
    const uint8_t* rows[2 * R];
    row_ptrs<R>(p.w, row0, p.n_out, p.row_bytes, rows);
    float part[2 * R];
    pf::pdl_wait();  // xa, xs come from the previous kernel
    TcQ4K::rows<R, KW>(rows, p.xa, p.xs, nsb, (int)(threadIdx.x >> 5), KW, part);
    bench_store<R, KW>(part, row0, p.n_out, p.out);
}

// ---------------------------------------------------------------------------------------------
// The norm prologue of mv_body's NORM kernels: the block computes rms_norm(h; w) of its vector's
// residual row and prepares it in F's layout in shared memory. Every block of the launch sums the
// squares in the same order (thread t: elements 4t .. 4t + 3, then 128 KW further on; then
// block_sum), so all of them normalize with the same scale, and block 0 of the vector writes the
// normed row (f32) for any other reader. Values as the CPU reference computes them: s = 1 /
// sqrt(mean(h^2) + eps), x = (h * s) * w (two roundings).
constexpr int NORM_V = 8;  // float4s of the row per thread: rows of up to 4 * 128 KW * NORM_V

// Where the block keeps x: the normed row (n_in floats), then F's words and sums.
template <class F>
struct NormSmem {
    float* xn;
    uint32_t* xa;
    float* xs;
};
template <class F>
static __device__ __forceinline__ NormSmem<F> norm_smem(int nsb) {
    DYNAMIC_SMEM(float, base);
    NormSmem<F> m;
    m.xn = base;
    m.xa = reinterpret_cast<uint32_t*>(base + nsb * 256);
    m.xs = reinterpret_cast<float*>(m.xa + nsb * F::WORDS);
    return m;
}

// This thread's norm weights (slot p7), the elements norm_prologue gives it.
template <int KW>
static __device__ __forceinline__ void norm_weights(const ::Args& a, int d, float4 (&nw)[NORM_V]) {
    const float* w = reinterpret_cast<const float*>(a.p[7]);
#pragma unroll
    for (int q = 0; q < NORM_V; q++) {
        const int j = 4 * (int)threadIdx.x + 128 * KW * q;
        nw[q] = j < d ? __ldg(reinterpret_cast<const float4*>(w + j)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// x = rms_norm(h[ov]; w) into m.xn, prepared into m.xa / m.xs: warp w prepares the super-blocks
// it reads (w, w + KW, ...: mv_body's split of a dense product), so only a warp barrier follows.
template <class F, int KW>
static __device__ __forceinline__ void norm_prologue(const ::Args& a, int nsb, int ov, const float4 (&nw)[NORM_V],
                                                     const NormSmem<F>& m) {
    __shared__ float sh[32];
    const int d = nsb * 256, tid = threadIdx.x;
    const float* h = reinterpret_cast<const float*>(a.p[0]) + (size_t)ov * d;
    float4 v[NORM_V];
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < NORM_V; q++) {
        const int j = 4 * tid + 128 * KW * q;
        if (j < d) {
            v[q] = __ldcg(reinterpret_cast<const float4*>(h + j));
            ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
        }
    }
    ss = block_sum(ss, sh);
    const float s = 1.0f / sqrtf(ss / (float)d + a.f[0]);
    float* out = blockIdx.x == 0 ? reinterpret_cast<float*>(a.p[3]) + (size_t)ov * d : nullptr;
#pragma unroll
    for (int q = 0; q < NORM_V; q++) {
        const int j = 4 * tid + 128 * KW * q;
        if (j < d) {
            const float4 y = make_float4(__fmul_rn(__fmul_rn(v[q].x, s), nw[q].x), __fmul_rn(__fmul_rn(v[q].y, s), nw[q].y),
                                         __fmul_rn(__fmul_rn(v[q].z, s), nw[q].z), __fmul_rn(__fmul_rn(v[q].w, s), nw[q].w));
            *reinterpret_cast<float4*>(m.xn + j) = y;
            if (out != nullptr) *reinterpret_cast<float4*>(out + j) = y;
        }
    }
    __syncthreads();
    for (int sb = tid >> 5; sb < nsb; sb += KW) F::prep(m.xn + sb * 256, m.xa + sb * F::WORDS, m.xs + sb * F::SUMS);
    __syncwarp();
}

// The weights mv_body loads before the wait: F's step in registers (PIPE), else nothing.
template <class F, int R, bool PIPE>
struct PreOf {
    struct type {};
};
template <class F, int R>
struct PreOf<F, R, true> {
    using type = typename F::template W<R>;
};

// ---------------------------------------------------------------------------------------------
// The production kernels (matvec_tc.cu; launched by src/backend/cuda/ops/linear.rs; run on the
// emulator by dev/cuda/emu/mvtc_checks.cpp), batched as kernels-cuda/matvec.cuh's are (grid.y =
// output vectors) and grouped the same way (grid.x over the segment table of common.cuh: a block
// computes rows of its segment's matrix only, exactly as in a launch of that matrix alone):
//   - dense T tokens:   vector v reads x row v, W; writes out[v];
//   - fused SwiGLU:     out[v] = silu(W x) * (W2 x) (GLU);
//   - MoE gate/up:      entry b = t k + j reads x row b / k (x_group = k), expert ids[b];
//   - MoE down:         out[t] = sum_j scales[t k + j] W_{ids[t k + j]} x[t k + j] (nsum = k),
//                       summed in a fixed order (no atomics: reproducible);
//   - either with a shared expert: k + 1 entries per token, the last one the shared expert's
//                       (common.cuh `MvShared`).
// Expert ids at or past n_experts contribute nothing (the CPU backend rejects them).
// One body for every format: F is its policy (TcQ4K here, mvtc8::TcQ80, mvtc6::TcQ6K), which
// reads one matrix's rows against one prepared x. x arrives prepared (words then sums, a row's
// share each: F::WORDS and F::SUMS per 256 inputs; the format's prep kernel, mvtc_prep_<format>).
// Slots: the segment table (W, out, n_out of each product; output vector v at out + v * n_out),
//        p1 W2 (GLU) or 0, p2 xa, p4 expert ids (u32) or 0, p5 scales or 0, p6 xs, p3 and p7 the
//        shared expert (SHARED: common.cuh mv_shared_slots).
//        n1 n_in, n2 row_bytes, n3 expert_bytes, n4 n_experts, n5 x_group, n6 nsum, n11 the L2
//        prefetches (bit 0: a dense block's rows before the wait, bit 1: a MoE sum's entries),
//        bit 3: PIPE kernels load their first step before the wait, bit 4: a PIPE SwiGLU loads its
//        up matrix's first step during the gate's last, bit 5 (not GLU): out += the result (the
//        residual add of `matmul_add_rms_norm`: each output row has one owner, so no atomics).
//
// DENSE: one vector per output, no experts (slots p4, p5, n3..n6 unread). The loop over summed
// entries then vanishes: with it, nvcc keeps the group loop's invariants live across it (Q8_0
// R = 2: 158-166 registers against 112, so fewer blocks per SM), so the tall kernels, which only
// dense products use, are instantiated without it.
//
// ALT (with DENSE): the block's product reads its prepared x at p4 (words) and p5 (sums) and its
// rows are n10 bytes: the second format of a launch that holds products of two (mvtc_mix_Q6_K_Q4_K,
// matvec_tc6.cu), whose first format takes the usual slots.
//
// NORM (with DENSE, not PIPE): the block's x is rms_norm(h; w) of the residual row h, which the block
// normalizes and prepares itself (`norm_prologue`) instead of reading a prepared copy: the norm
// after a product that added itself into the residual, as the prologue of the next block's first
// products (`AddNorm::then`), so that no norm launch stands between them. Slots: p0 h (rows of
// n_in), p7 the norm's weights [n_in], p3 the normed rows (f32; block 0 of each vector writes
// them), f0 eps; dynamic shared memory n_in floats then F's words and sums of n_in / 256
// super-blocks (`NormSmem`).
//
// PIPE: each matrix's share through rows_db (the next step's weights in flight during this one's
// arithmetic; F must have the load / math split), and a product without experts loads its first
// step's weights before the dependent-launch wait (weights are written by no kernel).
template <class F, int R, int KW, bool GLU, bool DENSE = false, bool SHARED = false, bool PIPE = false,
          bool ALT = false, bool NORM = false>
static __device__ __forceinline__ void mv_body(const ::Args& a) {
    static_assert(32 * KW >= 16 * R, "one thread per row for the final sum");
    static_assert(!(DENSE && SHARED), "a shared expert is one of a MoE product's experts");
    static_assert(!ALT || DENSE, "the alternate x slots are the experts' ids and scales");
    static_assert(!NORM || (DENSE && !GLU && !PIPE), "the norm prologue serves dense products");
    constexpr int NW = GLU ? 2 : 1;  // weight matrices
    __shared__ float red[NW][KW][16 * R];
    const MvSeg seg = mv_segment<GLU || SHARED ? 1 : F::SEGS>(a);  // this block's product
    const uint8_t* W[2] = {reinterpret_cast<const uint8_t*>(seg.w), reinterpret_cast<const uint8_t*>(a.p[1])};
    const uint32_t* xa = reinterpret_cast<const uint32_t*>(a.p[ALT ? 4 : 2]);
    float* out = reinterpret_cast<float*>(seg.out);
    const uint32_t* ids = DENSE ? nullptr : reinterpret_cast<const uint32_t*>(a.p[4]);
    const float* scales = DENSE ? nullptr : reinterpret_cast<const float*>(a.p[5]);
    const float* xs = reinterpret_cast<const float*>(a.p[ALT ? 5 : 6]);
    const int n_out = seg.rows, nsb = (int)(a.n[1] / 256);
    const size_t row_bytes = (size_t)a.n[ALT ? 10 : 2], expert_bytes = (size_t)a.n[3];
    const uint32_t n_experts = (uint32_t)a.n[4];
    const int x_group = DENSE ? 1 : (int)a.n[5], nsum = DENSE ? 1 : (int)a.n[6];
    const size_t out_stride = (size_t)n_out;
    const MvShared shx = mv_shared_slots<GLU>(a, x_group * nsum);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = ((int)blockIdx.x - seg.block0) * 16 * R, ov = blockIdx.y;

    // Dense weights are written by no kernel: this block's rows may be pulled into L2 while the
    // previous kernel finishes (n11 bit 0; by default only for launches of at most 16 MiB: for
    // larger ones it measured slower on the H200, the prefetches competing with the running
    // kernel's loads).
    if (ids == nullptr && (a.n[11] & 1))
        mv_prefetch_rows(W[0], GLU ? W[1] : nullptr, row0, min(16 * R, n_out - row0), row_bytes);
    // PIPE, no experts: this warp's first step of matrix 0 (warp index: no entry split without a
    // shared expert) before the wait.
    typename PreOf<F, R, PIPE>::type pre;
    bool has_pre = false;
    if constexpr (PIPE) {
        if (ids == nullptr && !SHARED && warp < nsb && (a.n[11] & 8)) {
            const uint8_t* rows[2 * R];
            row_ptrs<R>(W[0], row0, n_out, row_bytes, rows);
            F::template load<R>(rows, warp, pre);
            has_pre = true;
        }
    }
    // NORM: this thread's norm weights before the wait (weights are written by no kernel).
    float4 nw[NORM_V];
    if constexpr (NORM) norm_weights<KW>(a, nsb * 256, nw);
    kernel_start();
    NormSmem<F> xsm;
    if constexpr (NORM) {
        xsm = norm_smem<F>(nsb);
        norm_prologue<F, KW>(a, nsb, ov, nw, xsm);
        xa = xsm.xa;
        xs = xsm.xs;
    }
    // Bit 5: the row this thread stores, loaded now so its latency hides under the products
    // (the previous kernel, which may have written it, has finished: kernel_start waited).
    float resid = 0.0f;
    if constexpr (!GLU) {
        const int i = threadIdx.x;
        if ((a.n[11] & 32) && i < 16 * R && row0 + i < n_out) resid = __ldcg(out + (size_t)ov * out_stride + row0 + i);
    }
    if (!DENSE && ids != nullptr && nsum > 1 && !GLU && (a.n[11] & 2))
        mv_prefetch_entries<SHARED>(W[0], ids, shx, ov, nsum, n_experts, expert_bytes, row0, min(16 * R, n_out - row0),
                                    row_bytes);

    // A MoE sum whose rows have fewer super-blocks than the block has warps (the 35B-A3B's downs:
    // 2 of 8) would leave warps idle and take its entries in series: the warps split into KW / nsb
    // groups of nsb, group q taking entries q, q + KW / nsb, ... (the block still sums the warps'
    // partials in one fixed order). Only in the kernels with a shared expert, which every MoE
    // layer of the Qwen3.5 family takes: the others, mostly dense products, keep their registers.
    const int groups = SHARED && F::ANY_FIRST && nsum > 1 && nsb < KW && KW % nsb == 0 ? KW / nsb : 1;
    const int first = groups > 1 ? warp % nsb : warp, step = groups > 1 ? nsb : KW;

    float tot[NW][2 * R];
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
        for (int r = 0; r < 2 * R; r++) tot[m][r] = 0.0f;
    for (int j = groups > 1 ? warp / nsb : 0; j < nsum; j += groups) {
        const int b = ov * nsum + j;
        int tok;
        const bool shared = mv_shared_entry<SHARED>(shx, b, tok);
        uint32_t e = 0;
        if (ids != nullptr && !shared) {
            e = ids[b - tok];
            if (e >= n_experts) continue;  // uniform over the warp
        }
        // (NORM: the block prepared its own vector's x only.)
        const int xrow = NORM ? 0 : b / x_group;
        const uint32_t* xa_b = xa + (size_t)xrow * nsb * F::WORDS;
        const float* xs_b = xs + (size_t)xrow * nsb * F::SUMS;
        const float s = shared ? mv_shared_scale(shx, tok) : scales != nullptr ? scales[b - tok] : 1.0f;
#pragma unroll
        for (int m = 0; m < NW; m++) {
            const uint8_t* rows[2 * R];
            const uint8_t* Wsh = m == 0 ? shx.w : shx.w2;
            row_ptrs<R>(shared ? Wsh : W[m] + (size_t)e * expert_bytes, row0, n_out, row_bytes, rows);
            float part[2 * R];
            if constexpr (PIPE) {
                // A dense SwiGLU's up rows, whose first step loads during the gate's last one (n11 bit 4).
                const bool chain = GLU && m == 0 && ids == nullptr && (a.n[11] & 16);
                const uint8_t* up[2 * R];
                row_ptrs<R>(W[NW - 1], row0, n_out, row_bytes, up);
                has_pre = rows_db<F, R>(rows, xa_b, xs_b, nsb, first, step, part, pre, has_pre, up, chain);
            } else
                F::template rows<R, KW, NORM>(rows, xa_b, xs_b, nsb, first, step, part);
#pragma unroll
            for (int r = 0; r < 2 * R; r++) tot[m][r] = fmaf(s, part[r], tot[m][r]);
        }
    }

#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
        for (int r = 0; r < 2 * R; r++) {
            const float v = quad_sum(tot[m][r]);
            if (t == 0) red[m][warp][8 * r + g] = v;
        }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < 16 * R && row0 + i < n_out) {
        float v[NW];
#pragma unroll
        for (int m = 0; m < NW; m++) {
            v[m] = 0.0f;
#pragma unroll
            for (int w = 0; w < KW; w++) v[m] += red[m][w][i];
        }
        // acc + y as the CPU reference's add_assign: one f32 addition (resid is 0 without bit 5).
        out[(size_t)ov * out_stride + row0 + i] = GLU ? siluf_(v[0]) * v[NW - 1] : (a.n[11] & 32) ? resid + v[0] : v[0];
    }
}

#if !defined(PF_EMU) && defined(MVTC_BENCH_KERNELS)
// The harness's kernels (dev/cuda/matvec_bench.cu defines MVTC_BENCH_KERNELS).
static __global__ void __launch_bounds__(32) prep_x(const PrepArgs p) { prep_x_body(p); }
template <int R, int KW>
static __global__ void __launch_bounds__(32 * KW) q4k(const Args p) {
    q4k_body<R, KW>(p);
}
#endif

}  // namespace mvtc
