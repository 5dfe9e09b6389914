// matvec_tc6.cuh: the decode Q6_K matrix-vector product on the integer tensor cores (mma.sync
// m16n8k32 s8.s8.s32), at the strict (f32-class) tier: the production kernels of matvec_tc6.cu
// (through matvec_tc.cuh's body, policy TcQ6K), the candidate dev/cuda/matvec_bench.cu times,
// dev/cuda/emu/mvtc_checks.cpp's checks on the CPU emulator.
//
//   out[o] = sum_i W[o][i] * x[i],  W in Q6_K: w = d * sc_j * (q - 32)
//   (q 6 bits: ql nibble + 2 qh bits; sc_j int8 per 16 elements; d f16 per 256; 210 bytes)
//
// Why int8: (q - 32) sc is 13 bits, not exact in f16, so the Q4_K kernel's folding of the scale
// into f16 weights (matvec_tc.cuh) needs two MMAs per weight tile (sc = 16 hi + lo) and ~2.5
// instructions per weight. Here:
//   * A byte = 4 (q - 32) = (4q) ^ 0x80: nibble << 2 | qh bits << 6, top bit flipped (two LOP3 and
//     two shifts per 4 weights, SHF/LOP3 only, no conversion); the 4 goes into 1/s.
//   * x per super-block: s = 2^(29 - e), X = rint(x s) in four signed digits (matvec_tc8.cuh).
//   * Lane (g, t) owns the quants of sub-blocks 8h + t (low nibbles) and 8h + 4 + t (high nibbles)
//     of each half h: its 16-byte windows are ql[64h + 16t ..] and qh[32h + 16(t & 1) ..], which
//     hold exactly those 32 quants (k order within an MMA is free: B is permuted to match). An MMA
//     therefore mixes four sub-blocks (one per lane t), so each B column is (sub-block of lane
//     t', digit 2 pi + delta) with n = 2t' + delta: two MMAs per (h, nibble) for digits 0, 1 and
//     two for digits 2, 3, 16 per super-block and tile. B is non-zero only in lanes g >> 1 == t
//     (8 of 32: 1 KB per 256 inputs). C lane (g, t) then holds exactly its own sub-block's digit
//     sums for rows g, g+8 (|C| <= 2 * 8 * 128 * 128: exact): v = (C0 + 256 C1) + 65536 (C2 +
//     256 C3), two int32 sums each rounded once to f32; acc_sb += v * sc in f32, and per
//     super-block acc += acc_sb * (d / 4s).
//   * Alignment: a 210-byte super-block sits at (2 sb) mod 16 of a 16-byte aligned row (n_in %
//     2048 == 0), so with KW = 8 warps striding over super-blocks, warp w always sees offset 2w:
//     the loop body is a template on that offset (8 instances, chosen once per warp), each
//     16-byte window is two aligned 16-byte loads and a compile-time word pick, plus one funnel
//     shift per word for the odd offsets. The last super-block of a row (offset 14) ends exactly
//     at the row end: nothing is read past a row.
//     MoE rows (the shared-expert kernels, policy TcQ6KAny) need more: the 35B-A3B's expert rows of
//     512 inputs are 420 bytes, so rows start at any multiple of 4 and lanes of one warp (rows
//     8r + g) see different offsets. There each window is five 4-byte loads from its start
//     rounded down to 4 and one funnel shift per word by 0 or 16 bits, chosen at run time
//     (`load_row_any`): one body for any address, first super-block and warp count. The word that
//     holds d then reaches two bytes past the super-block: past a row's end only into the weights'
//     padding (src/backend/cuda/buffer.rs WEIGHT_PAD). Not for the dense products: the same body
//     there measured faster alone but slower in the 9B decode chain (H200: 320.5 ->
//     310.5 t/s); on the MoE downs it replaces the f32 kernels (16.6 -> 12.4 us per layer alone,
//     35B-A3B decode within noise: dev/cuda/DECISIONS.md, tensor cores).
//
// Instructions per weight (lane, super-block, row tile = 128 weights per lane): weight loads
// 2 x 10 LDG.128, realignment 2 x 18 SHF on half the warps, decode 2 x 64 (1 per weight),
// 16 IMMA, epilogue 8 x (2 IMAD, 2 I2F, FFMA, byte extract, I2F, FFMA) + 2 x 3, and 8 LDG.128 of B per
// super-block shared by the R tiles: ~1.9 per weight on paper. SASS (nvcc 13.0, sm_90, main loop
// per super-block): R=1 318-332 instructions (even offsets) / 368-371 (odd: the funnel shifts) =
// 2.5-2.9 per weight; R=2 584-600 / 680 per 256 = 2.3-2.65 (the f32 kernels: ~5). The decode
// compiles to 3 LOP3 + 2 shifts per 4 weights (mask, combine, sign flip are not fused). Left to
// cut: A = 4q as u8 (mma .u8.s8) with the -32 q carried by the first MMA's C input (-128 x the
// digit sums of the sub-block, from the prep kernel) saves the flip and a mask: ~1.5 per 4
// weights, ~0.35 per weight. Registers (-Xptxas -v, no spills): R=1 96, R=2 152; prep_x 43.
//
// Two launches: mvtc6::prep_x (x -> B words and 1/4s per super-block; one warp) and
// mvtc6::q6k<R> (KW = 8 warps own 16R rows). Requirements: n_in % 2048 == 0, W 16-byte aligned
// (TcQ6KAny: n_in % 256 == 0, W 4-byte aligned and padded). NaN or inf in a super-block of x makes
// its scale NaN: every output that reads it is NaN.
#pragma once

#include "matvec_tc8.cuh"

namespace mvtc6 {

using mvtc::ld16;
using mvtc8::i2f;
using mvtc8::mma_s8;

constexpr int KW = 8;             // warps per block (the alignment scheme needs 8)
constexpr int SB_WORDS = 8 * 32;  // B words per super-block: 8 active lanes x 32

// ---------------------------------------------------------------------------------------------
// Prep (prep_sb_warp, below: one warp per super-block of x), its layout:
//   xb[(sb * 8 + g) * 32 + ((2h + nu) * 2 + pi) * 4 + 2m + kk]: word kk (b0, b1) of the m-th MMA
//   of half h, nibble nu (0 low, 1 high), digits 2pi, 2pi+1, for lane g (its t = g >> 1);
//   xs[sb] = 1 / (4 s) (NaN: non-finite x).
// Word 2m + kk = wi holds digit 2pi + (g & 1) of elements 128h + 32pt + 16(t & 1) + 4wi + b (byte
// b), pt = (t >> 1) + 2nu: four consecutive elements, the first a multiple of 4.
struct PrepArgs {
    const float* x;
    uint32_t* xb;
    float* xs;
};

// One super-block of x (256 values at x_sb, 32-byte aligned) prepared by one warp, lane l holding
// elements 8l .. 8l+7: its B words into xb_sb, 1 / 4s into xs_sb[0]. No shared memory and no
// barrier, so any warp of any kernel can prepare a super-block. Each lane owns two runs of four
// elements (8l, 8l + 4): their digits, transposed to one word per digit, are exactly the words
// the layout holds, stored where it puts them. The result is the same, bit for bit, as the former
// 256-thread prep kernel's (dev/cuda/emu/mvtc_checks.cpp keeps it).
static __device__ __forceinline__ void prep_sb_warp(const float* x_sb, uint32_t* xb_sb, float* xs_sb) {
    const int l = threadIdx.x & 31;
    float v[8];
    mvtc8::ld8(x_sb + 8 * l, v);
    float m = mvtc8::abs_max8(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s;
    const float inv_s = mvtc8::digit_scale(m, s);
    uint32_t dg[8];
#pragma unroll
    for (int k = 0; k < 8; k++) dg[k] = mvtc8::digits(v[k], s, inv_s == inv_s);
    if (l == 0) xs_sb[0] = inv_s * 0.25f;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // Digit words of elements e0 .. e0+3 (bytes: digits 0..3) -> one word per digit (bytes:
        // elements e0 .. e0+3): a 4x4 byte transpose.
        const uint32_t* q = dg + 4 * r;
        const uint32_t lo01 = pf::prmt(q[0], q[1], 0x5140u), hi01 = pf::prmt(q[0], q[1], 0x7362u);
        const uint32_t lo23 = pf::prmt(q[2], q[3], 0x5140u), hi23 = pf::prmt(q[2], q[3], 0x7362u);
        const uint32_t dw[4] = {pf::prmt(lo01, lo23, 0x5410u), pf::prmt(lo01, lo23, 0x7632u),
                                pf::prmt(hi01, hi23, 0x5410u), pf::prmt(hi01, hi23, 0x7632u)};
        const int e0 = 8 * l + 4 * r;
        const int h = e0 >> 7, pt = (e0 >> 5) & 3, t = 2 * (pt & 1) + ((e0 >> 4) & 1), wi = (e0 >> 2) & 3;
        const int j0 = 16 * h + 8 * (pt >> 1) + wi;
#pragma unroll
        for (int d = 0; d < 4; d++) xb_sb[32 * (2 * t + (d & 1)) + j0 + 4 * (d >> 1)] = dw[d];
    }
}

// The prep kernel: one warp per super-block (blocks of 32 threads, grid.x = n_in / 256), grid.y =
// rows of x (row y at x + y n_in, its words and scales at y times a row's share).
static __device__ __forceinline__ void prep_x_body(const PrepArgs& p) {
    const size_t sb = (size_t)blockIdx.y * gridDim.x + blockIdx.x;  // super-block index over all rows
    pf::pdl_wait();
    prep_sb_warp(p.x + sb * 256, p.xb + sb * SB_WORDS, p.xs + sb);
}

// ---------------------------------------------------------------------------------------------
// The product.
struct Args {
    const uint8_t* w;
    const uint32_t* xb;
    const float* xs;
    float* out;
    int n_out, n_in;
    size_t row_bytes;
};

// 16 bytes at byte offset OFF + 4i of the 32 bytes at the aligned address a (two loads).
template <int OFF, int NW>
static __device__ __forceinline__ void window(const uint8_t* a, uint32_t (&o)[NW]) {
    const uint4 u = ld16(a), v = ld16(a + 16);
    const uint32_t w[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
    constexpr int Q = OFF / 4;
#pragma unroll
    for (int i = 0; i < NW; i++) o[i] = (OFF & 2) ? pf::funnel_r(w[Q + i], w[Q + i + 1], 16) : w[Q + i];
}

// 4 (q - 32) of four quants as signed bytes: nibbles at bits 2..5 of `nib`, qh bits at 6..7 of `hb`.
static __device__ __forceinline__ uint32_t q6_bytes(uint32_t nib, uint32_t hb) {
    return ((nib & 0x3C3C3C3Cu) | (hb & 0xC0C0C0C0u)) ^ 0x80808080u;
}

// One row's data of one super-block, realigned: ql and qh windows of both halves, the scales.
struct Row6 {
    uint32_t ql[2][4], qh[2][4], sc[4];
    uint32_t d;  // f16 bits
};
template <int OFF>
static __device__ __forceinline__ void load_row(const uint8_t* b, int t, Row6& r) {
    const uint8_t* a = b - OFF;  // 16-byte aligned
#pragma unroll
    for (int h = 0; h < 2; h++) {
        window<OFF>(a + 64 * h + 16 * t, r.ql[h]);
        window<OFF>(a + 128 + 32 * h + 16 * (t & 1), r.qh[h]);
    }
    const uint4 u = ld16(a + 192), v = ld16(a + 208);
    const uint32_t w[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
    constexpr int Q = OFF / 4;
#pragma unroll
    for (int i = 0; i < 4; i++) r.sc[i] = (OFF & 2) ? pf::funnel_r(w[Q + i], w[Q + i + 1], 16) : w[Q + i];
    r.d = (OFF & 2) ? w[4 + Q] >> 16 : w[4 + Q] & 0xffffu;
}

// 4-byte loads of weight words (the run-time realignment below).
#ifdef PF_EMU
static inline uint32_t ld4(const uint32_t* p) {
    if (reinterpret_cast<uintptr_t>(p) % 4) ::pf_emu::fail("mvtc6: misaligned 4-byte load");
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#else
static __device__ __forceinline__ uint32_t ld4(const uint32_t* p) { return __ldg(p); }
#endif

// The 4 words that start sh / 8 bytes (0 or 2) after the aligned word w (five 4-byte loads);
// `last` is the fifth.
static __device__ __forceinline__ void window_any(const uint32_t* w, int sh, uint32_t (&o)[4], uint32_t& last) {
    uint32_t v[5];
#pragma unroll
    for (int i = 0; i < 5; i++) v[i] = ld4(w + i);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = pf::funnel_r(v[i], v[i + 1], sh);
    last = v[4];
}

// load_row for a super-block at any even address b, realigned at run time.
static __device__ __forceinline__ void load_row_any(const uint8_t* b, int t, Row6& r) {
    const uintptr_t pa = reinterpret_cast<uintptr_t>(b);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(pa & ~(uintptr_t)3);
    const int sh = (int)(pa & 2) * 8;
    uint32_t last;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        window_any(w + 16 * h + 4 * t, sh, r.ql[h], last);
        window_any(w + 32 + 8 * h + 4 * (t & 1), sh, r.qh[h], last);
    }
    window_any(w + 48, sh, r.sc, last);  // bytes 192..207; `last` holds d (bytes 208, 209)
    r.d = (last >> sh) & 0xffffu;
}

// One super-block's weights of the block's 2R rows, realigned (OFF: the super-block's byte offset
// from a 16-byte boundary, or -1: any even address, load_row_any).
template <int R, int OFF>
static __device__ __forceinline__ void q6k_load(const uint8_t* const (&rows)[2 * R], int sb, Row6 (&rw)[2 * R]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        if constexpr (OFF < 0)
            load_row_any(rows[r] + (size_t)sb * 210, t, rw[r]);
        else
            load_row<OFF>(rows[r] + (size_t)sb * 210, t, rw[r]);
    }
}

// The arithmetic of super-block sb once its rows are in registers: the x words' loads, the MMAs,
// the sub-block scales and acc += sum * d / (4 s).
template <int R>
static __device__ __forceinline__ void q6k_math(const Row6 (&rw)[2 * R], int sb, const uint32_t* xbp, const float* xs,
                                                float (&acc)[2 * R]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool active = (g >> 1) == t;
    const int sl = 6 - 2 * (t >> 1), shh = 2 - 2 * (t >> 1);  // qh field of the low / high nibble -> bits 6..7
    const int sct = 8 * t;  // sc byte t of a word: this lane's sub-block
    const int zero[4] = {0, 0, 0, 0};
    uint32_t xb[32];
    if (active) {
        const uint32_t* src = xbp + ((size_t)sb * 8 + g) * 32;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint4 v = ld16(src + 4 * k);
            xb[4 * k] = v.x;
            xb[4 * k + 1] = v.y;
            xb[4 * k + 2] = v.z;
            xb[4 * k + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < 32; k++) xb[k] = 0u;
    }
    const float fs = xs[sb];

#pragma unroll
    for (int rt = 0; rt < R; rt++) {
        const Row6 &ra = rw[2 * rt], &rb = rw[2 * rt + 1];
        float sa = 0.0f, sbv = 0.0f;  // this super-block's sum_j sc_j v_j for rows g, g+8
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int nu = 0; nu < 2; nu++) {
                uint32_t qa[4], qb[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    qa[k] = nu ? q6_bytes(ra.ql[h][k] >> 2, ra.qh[h][k] << shh)
                               : q6_bytes(ra.ql[h][k] << 2, ra.qh[h][k] << sl);
                    qb[k] = nu ? q6_bytes(rb.ql[h][k] >> 2, rb.qh[h][k] << shh)
                               : q6_bytes(rb.ql[h][k] << 2, rb.qh[h][k] << sl);
                }
                const int base = (2 * h + nu) * 8;
                int c0[4], c1[4];
                mma_s8(c0, zero, qa[0], qb[0], qa[1], qb[1], xb[base], xb[base + 1]);
                mma_s8(c0, c0, qa[2], qb[2], qa[3], qb[3], xb[base + 2], xb[base + 3]);
                mma_s8(c1, zero, qa[0], qb[0], qa[1], qb[1], xb[base + 4], xb[base + 5]);
                mma_s8(c1, c1, qa[2], qb[2], qa[3], qb[3], xb[base + 6], xb[base + 7]);
                const float va = fmaf(i2f(c1[0] + c1[1] * 256), 65536.0f, i2f(c0[0] + c0[1] * 256));
                const float vb = fmaf(i2f(c1[2] + c1[3] * 256), 65536.0f, i2f(c0[2] + c0[3] * 256));
                const int sca = (int8_t)(uint8_t)(ra.sc[2 * h + nu] >> sct);
                const int scb = (int8_t)(uint8_t)(rb.sc[2 * h + nu] >> sct);
                sa = fmaf(va, i2f(sca), sa);
                sbv = fmaf(vb, i2f(scb), sbv);
            }
        }
        acc[2 * rt] = fmaf(sa, pf::h2f(ra.d) * fs, acc[2 * rt]);
        acc[2 * rt + 1] = fmaf(sbv, pf::h2f(rb.d) * fs, acc[2 * rt + 1]);
    }
}

// Super-blocks first, first + step, ... of the 2R rows: every one at byte offset OFF of a 16-byte
// boundary, or anywhere (OFF = -1: load_row_any).
template <int R, int OFF>
static __device__ __forceinline__ void q6k_loop(int first, int step, const uint8_t* const (&rows)[2 * R],
                                                const uint32_t* xbp, const float* xs, int nsb, float (&acc)[2 * R]) {
    for (int sb = first; sb < nsb; sb += step) {
        Row6 rw[2 * R];
        q6k_load<R, OFF>(rows, sb, rw);
        q6k_math<R>(rw, sb, xbp, xs, acc);
    }
}

// One weight matrix's share of this warp (KW = 8 warps): super-blocks warp, warp + 8, ... of the
// 2R rows rows[r] (rows 8r + g of the block) against the prepared x of one vector (xb, xs at its
// first super-block). Adds the lane's partial dot products to acc.
template <int R>
static __device__ __forceinline__ void q6k_rows(const uint8_t* const (&rows)[2 * R], const uint32_t* xb,
                                                const float* xs, int nsb, float (&acc)[2 * R]) {
    const int warp = threadIdx.x >> 5;
    // Warp w reads super-blocks w, w + 8, ...: all at byte offset 2w of a 16-byte boundary.
    switch (warp) {
        case 0: q6k_loop<R, 0>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 1: q6k_loop<R, 2>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 2: q6k_loop<R, 4>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 3: q6k_loop<R, 6>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 4: q6k_loop<R, 8>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 5: q6k_loop<R, 10>(warp, KW, rows, xb, xs, nsb, acc); break;
        case 6: q6k_loop<R, 12>(warp, KW, rows, xb, xs, nsb, acc); break;
        default: q6k_loop<R, 14>(warp, KW, rows, xb, xs, nsb, acc); break;
    }
}

// The format policy of the production body (matvec_tc.cuh mv_body): KW = 8 only (the alignment
// scheme), one f32 (1 / 4s) per super-block.
struct TcQ6K {
    static constexpr int WORDS = SB_WORDS, SUMS = 1;
    // One product per launch: with a per-block weight pointer mvtc_Q6_K takes 110 registers
    // against 80 (ptxas -v, nvcc 13.0), two blocks per SM instead of three, on every Q6_K
    // product (the LM head, half the FFN down projections of Q4_K_M); and Q4_K_M groups hold one
    // Q6_K product at most (qkv or v). ops/linear.rs `takes_group` says the same.
    static constexpr int SEGS = 1;
    // Warp w must read super-blocks w, w + 8, ... (its loads are compiled for their alignment).
    static constexpr bool ANY_FIRST = false;
    template <int R, int KWB, bool XS = false>
    static __device__ __forceinline__ void rows(const uint8_t* const (&w)[2 * R], const uint32_t* xb, const float* xs,
                                                int nsb, int, int, float (&part)[2 * R]) {
        static_assert(KWB == KW, "the Q6_K loads assume 8 warps per block");
        static_assert(!XS, "x in global memory only (mv_body NORM serves Q4_K)");
#pragma unroll
        for (int r = 0; r < 2 * R; r++) part[r] = 0.0f;
        q6k_rows<R>(w, xb, xs, nsb, part);
    }
};

// The policy of the MoE (shared-expert) kernels: rows at any even address, any warp count, any
// first super-block (so mv_body may split a sum's warps over its entries), the weights padded.
struct TcQ6KAny {
    static constexpr int WORDS = SB_WORDS, SUMS = 1;
    static constexpr int SEGS = 1;
    static constexpr bool ANY_FIRST = true;
    template <int R, int KWB, bool XS = false>
    static __device__ __forceinline__ void rows(const uint8_t* const (&w)[2 * R], const uint32_t* xb, const float* xs,
                                                int nsb, int first, int step, float (&part)[2 * R]) {
        static_assert(!XS, "x in global memory only");
#pragma unroll
        for (int r = 0; r < 2 * R; r++) part[r] = 0.0f;
        q6k_loop<R, -1>(first, step, w, xb, xs, nsb, part);
    }
};

// The candidate of dev/cuda/matvec_bench.cu: one dense product, out = W x.
template <int R>
static __device__ __forceinline__ void q6k_body(const Args& p) {
    const int row0 = blockIdx.x * 16 * R;
    const uint8_t* rows[2 * R];
    mvtc::row_ptrs<R>(p.w, row0, p.n_out, p.row_bytes, rows);
    float acc[2 * R];
#pragma unroll
    for (int r = 0; r < 2 * R; r++) acc[r] = 0.0f;
    pf::pdl_wait();
    q6k_rows<R>(rows, p.xb, p.xs, p.n_in / 256, acc);
    mvtc::bench_store<R, KW>(acc, row0, p.n_out, p.out);
}

#if !defined(PF_EMU) && defined(MVTC_BENCH_KERNELS)
// The harness's kernels (dev/cuda/matvec_bench.cu defines MVTC_BENCH_KERNELS).
static __global__ void __launch_bounds__(32) prep_x(const PrepArgs p) { prep_x_body(p); }
template <int R>
static __global__ void __launch_bounds__(32 * KW) q6k(const Args p) {
    q6k_body<R>(p);
}
#endif

}  // namespace mvtc6
