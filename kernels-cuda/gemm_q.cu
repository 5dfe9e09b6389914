// gemm_q.cu: prefill matrix products on the tensor cores, with the weights dequantized inside the
// kernel.  y[r][o] = dot(W[o], x[r]) for W [n_out, n_in] in its GGUF block format (Q4_K, Q5_K,
// Q6_K, Q8_0, F16, BF16; blocks run along the rows) and x [rows, n_in] in f16; y f32.
//
// Precision, by weight format (f32 accumulation in every case):
//   * Q4_K, Q5_K, Q6_K, Q8_0: x rounded to f16, weights dequantized in f32 then rounded to f16
//     (fixtures/README.md "F16-rounded activations": rel L2 <= ~6e-3; measured here ~3e-4). The
//     weights' own quantization error (~1e-2 relative for Q4_K, ~4e-3 for Q8_0) dwarfs the 2^-11
//     of the f16 roundings, so one f16 term per operand is all the precision worth paying for.
//   * F16, BF16 ("split" formats): x as two f16 planes, hi = f16(x) and lo = f16(x - hi) (made by
//     pf_f32_to_f16 / pf_swiglu_f16 with their `lo` output), and y = W hi + W lo: two mma.sync
//     per fragment into the same f32 accumulators. These weights carry no quantization error, so
//     rounding x to f16 would be the only error of the whole product, and it costs argmax
//     agreement on near-ties (the dense F16 fixture has a position whose transformers top-2 gap
//     of 0.0104 shrinks to 0.0009 when only the products' activations are rounded to f16). hi + lo
//     holds x to 2^-22 |x| + 2^-25 (the lo plane's own f16 rounding, and f16 subnormals for tiny
//     values): f32-class activations for twice the tensor-core work and a second x tile in shared
//     memory. F16 weights enter the mma exactly. BF16 weights are converted bf16 -> f32 (exact)
//     -> f16 (round to nearest): exact for 2^-17 <= |w| <= 65504 (bf16's 8-bit significand fits
//     f16's 11 bits down to f16 subnormal spacing 2^-24); smaller |w| keep an absolute error
//     <= 2^-25 (below 2^-25 they flush to zero), larger ones become inf (never seen in models).
//   The range limit of both: |x| > 65504 becomes inf (x is a normalised activation).
//
// One CTA computes a BM x BN tile of y (BM rows of x, BN weight rows) over a K range:
//   * x tiles (BM x 64 f16) arrive by cp.async, S stages deep;
//   * the weight bytes of RS consecutive 64-wide K steps ("a super-step": one Q4_K/Q5_K/Q6_K
//     super-block, four Q8_0 blocks, or 64 F16/BF16 values) arrive raw by cp.async, RSLOTS slots;
//   * thread r (one thread per weight row, NTH == BN) dequantizes its row of the *next* K step from
//     the raw slot into a BN x 64 f16 tile (two buffers), interleaved with the mma.sync of the
//     current step; one __syncthreads per K step;
//   * warps (WM x WN) each own an (MT*16) x (NT*8) block of y and run m16n8k16 f16 mma.sync with
//     ldmatrix fragments from XOR-swizzled tiles (16-byte chunk c of row r sits at c ^ (r & 7)).
// Split-K (grid.z > 1) writes partial tiles to a workspace that pf_gemm_splitk_reduce sums in a
// fixed order (deterministic). Grouped mode (MoE) takes its row ranges and expert from a tile list
// built on the device (moe_group.cu) and gathers x rows through `x_rows`.
//
// Requirements checked by the host: n_in % 64 == 0 (K-quants: % 256, inherent to the format);
// the weight base and the x / y bases 16-byte aligned; the weight allocation holds whole 16-byte
// chunks (Q6_K and Q8_0 rows are copied as the 16-byte aligned chunks that cover them, so the last
// row may read up to 15 bytes past the last block: allocate weights rounded up to 16 bytes).
#include "pf_common.cuh"

#include <stddef.h>

namespace pf {

enum GemmFmt { FMT_Q4K = 0, FMT_Q5K = 1, FMT_Q6K = 2, FMT_Q80 = 3, FMT_F16 = 4, FMT_BF16 = 5 };

// RS: 64-wide K steps per raw super-step; SB: raw bytes of one super-step of one row;
// NCH: 16-byte chunks copied per row and super-step (covers SB bytes starting at any even
// misalignment); RAWB: shared-memory row stride, an odd number of chunks so that 16-byte reads of
// 8 consecutive rows hit 8 different bank groups; ALIGNED: every super-step starts 16-byte aligned.
struct FmtConsts {
    int rs, sb, nch, rawb;
    bool aligned;
};
//                                       RS   SB   NCH  RAWB  ALIGNED
inline constexpr FmtConsts FMT_CONSTS[6] = {{4, 144, 9, 144, true},    // Q4_K
                                            {4, 176, 11, 176, true},   // Q5_K
                                            {4, 210, 14, 240, false},  // Q6_K (2-byte aligned blocks)
                                            {2, 136, 10, 176, false},  // Q8_0 (2-byte aligned blocks)
                                            {1, 128, 8, 144, true},    // F16
                                            {1, 128, 8, 144, true}};   // BF16
template <int FMT>
struct FmtInfo {
    static constexpr int RS = FMT_CONSTS[FMT].rs, SB = FMT_CONSTS[FMT].sb, NCH = FMT_CONSTS[FMT].nch,
                         RAWB = FMT_CONSTS[FMT].rawb;
    static constexpr bool ALIGNED = FMT_CONSTS[FMT].aligned;
    // The weights are exact in f16: x arrives as two f16 planes (hi, lo) and every fragment takes
    // two mma.sync (see the top of the file).
    static constexpr bool SPLIT = FMT == FMT_F16 || FMT == FMT_BF16;
};

// ---------------------------------------------------------------- dequantization units
//
// unit(row, off, sub, kk, o0, o1): elements 16 kk .. 16 kk + 15 of K step `sub` of the super-step
// held in `row` (a shared-memory copy of the 16-byte chunks covering it; the super-step starts at
// byte `off` of `row`), as 16 f16 in o0 (elements 0..7) and o1 (8..15). Layouts: src/quant
// (ggml's block_q4_K etc.); the f32 values are ggml's `dequantize_row_*` up to one f32 rounding
// (an fma), then rounded to f16.

// Scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block from its 12 packed scale bytes
// s0 = bytes 0..3, s1 = 4..7, s2 = 8..11 (ggml's get_scale_min_k4).
PF_HD void k4_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, float& sc,
                                                    float& m) {
    // Both cases computed and selected (j is uniform, but a branch would split the unrolled loop).
    const int jl = 8 * (j & 3);
    const uint32_t b0 = (s0 >> jl) & 0xffu, b1 = (s1 >> jl) & 0xffu, b2 = (s2 >> jl) & 0xffu;
    const uint32_t sc_hi = (b2 & 0xfu) | ((b0 >> 6) << 4), m_hi = (b2 >> 4) | ((b1 >> 6) << 4);
    sc = static_cast<float>(j < 4 ? (b0 & 63u) : sc_hi);
    m = static_cast<float>(j < 4 ? (b1 & 63u) : m_hi);
}

// d * scale and dmin * min of sub-block j of the Q4_K/Q5_K super-block whose 16-byte header
// (d, dmin, 12 scale bytes) starts `row`, in ggml's f32 operation order.
PF_HD void k4_sub_block(const uint8_t* row, int j, float& dl, float& ml) {
    const uint4 h = *reinterpret_cast<const uint4*>(row);
    float sc, m;
    k4_scale_min(j, h.y, h.z, h.w, sc, m);
    dl = h2f(h.x & 0xffffu) * sc;
    ml = h2f(h.x >> 16) * m;
}

// Eight values held one per byte in v0 (elements 0..3) and v1 (4..7), each as bias-offset
// integers, to f16: y = (byte - bias') * scale - sub.
PF_HD uint4 bytes_to_h8(uint32_t v0, uint32_t v1, float bias, float scale, float sub) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = fmaf(byte_as_float(v0, i, bias), scale, -sub);
        f[i + 4] = fmaf(byte_as_float(v1, i, bias), scale, -sub);
    }
    uint4 o;
    o.x = pack_half2(f[0], f[1]);
    o.y = pack_half2(f[2], f[3]);
    o.z = pack_half2(f[4], f[5]);
    o.w = pack_half2(f[6], f[7]);
    return o;
}

template <int FMT>
struct Deq;

// Q4_K (144 B): d, dmin (f16), 12 scale bytes, qs[128]. Step c: qs[32c .. 32c+32); elements 0..31
// are the low nibbles (sub-block 2c), 32..63 the high nibbles (sub-block 2c+1).
template <>
struct Deq<FMT_Q4K> {
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int, int c, int kk, uint4& o0, uint4& o1) {
        float dl, ml;
        k4_sub_block(row, 2 * c + (kk >> 1), dl, ml);
        const uint4 q = *reinterpret_cast<const uint4*>(row + 16 + 32 * c + 16 * (kk & 1));
        const int sh = (kk >> 1) * 4;
        o0 = bytes_to_h8((q.x >> sh) & 0x0f0f0f0fu, (q.y >> sh) & 0x0f0f0f0fu, MAGIC, dl, ml);
        o1 = bytes_to_h8((q.z >> sh) & 0x0f0f0f0fu, (q.w >> sh) & 0x0f0f0f0fu, MAGIC, dl, ml);
    }
};

// Q5_K (176 B): d, dmin, 12 scale bytes, qh[32], qs[128]. Like Q4_K plus a fifth bit: element l of
// the low half takes bit 2c of qh[l], of the high half bit 2c+1.
template <>
struct Deq<FMT_Q5K> {
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int, int c, int kk, uint4& o0, uint4& o1) {
        float dl, ml;
        k4_sub_block(row, 2 * c + (kk >> 1), dl, ml);
        const uint4 qh = *reinterpret_cast<const uint4*>(row + 16 + 16 * (kk & 1));
        const uint4 q = *reinterpret_cast<const uint4*>(row + 48 + 32 * c + 16 * (kk & 1));
        const int sh = (kk >> 1) * 4, hb = 2 * c + (kk >> 1);
        auto v = [&](uint32_t qw, uint32_t hw) {
            return ((qw >> sh) & 0x0f0f0f0fu) | (((hw >> hb) & 0x01010101u) << 4);
        };
        o0 = bytes_to_h8(v(q.x, qh.x), v(q.y, qh.y), MAGIC, dl, ml);
        o1 = bytes_to_h8(v(q.z, qh.z), v(q.w, qh.w), MAGIC, dl, ml);
    }
};

// Q6_K (210 B): ql[128], qh[64], scales[16] (int8), d (f16). Half h2 = c / 2 of the block holds
// elements l + 32 k (l < 32, k < 4): low 4 bits from ql[64 h2 + l + 32 (k & 1)] (nibble k / 2),
// high 2 bits from qh[32 h2 + l] bits 2k, scale scales[8 h2 + l / 16 + 2k], value (q - 32) d sc.
// Step c = 2 h2 + p covers k = 2p (elements 0..31) and 2p + 1 (32..63).
template <>
struct Deq<FMT_Q6K> {
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int off, int c, int kk, uint4& o0,
                                                uint4& o1) {
        const int h2 = c >> 1, p = c & 1, k = 2 * p + (kk >> 1);
        const uint4 ql = ld16_even(row, off + 64 * h2 + 16 * kk);
        const uint4 qh = ld16_even(row, off + 128 + 32 * h2 + 16 * (kk & 1));
        const float sc = static_cast<float>(static_cast<int8_t>(ld_u8(row, off + 192 + 8 * h2 + (kk & 1) + 2 * k)));
        const float d = ld_f16_even(row, off + 208);
        const float ds = d * sc;
        const int ls = 4 * p, hs = 2 * k;
        auto v = [&](uint32_t lw, uint32_t hw) {
            return ((lw >> ls) & 0x0f0f0f0fu) | (((hw >> hs) & 0x03030303u) << 4);
        };
        o0 = bytes_to_h8(v(ql.x, qh.x), v(ql.y, qh.y), MAGIC + 32.0f, ds, 0.0f);
        o1 = bytes_to_h8(v(ql.z, qh.z), v(ql.w, qh.w), MAGIC + 32.0f, ds, 0.0f);
    }
};

// Q8_0 (34 B): d (f16), qs[32] (int8). A super-step is 4 blocks; step c holds blocks 2c, 2c+1.
template <>
struct Deq<FMT_Q80> {
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int off, int c, int kk, uint4& o0,
                                                uint4& o1) {
        const int fb = off + 34 * (2 * c + (kk >> 1));
        const float d = ld_f16_even(row, fb);
        const uint4 q = ld16_even(row, fb + 2 + 16 * (kk & 1));
        // int8 -> (q + 128) as unsigned bytes, exact through the 2^23 trick.
        o0 = bytes_to_h8(q.x ^ 0x80808080u, q.y ^ 0x80808080u, MAGIC + 128.0f, d, 0.0f);
        o1 = bytes_to_h8(q.z ^ 0x80808080u, q.w ^ 0x80808080u, MAGIC + 128.0f, d, 0.0f);
    }
};

template <>
struct Deq<FMT_F16> {
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int, int, int kk, uint4& o0, uint4& o1) {
        o0 = *reinterpret_cast<const uint4*>(row + 32 * kk);
        o1 = *reinterpret_cast<const uint4*>(row + 32 * kk + 16);
    }
};

// BF16 -> f32 (exact) -> f16 (round to nearest; |w| < 6e-5 becomes an f16 subnormal).
template <>
struct Deq<FMT_BF16> {
    static __host__ __device__ __forceinline__ uint32_t cvt(uint32_t w) {
        return pack_half2(u2f(w << 16), u2f(w & 0xffff0000u));
    }
    static __host__ __device__ __forceinline__ void unit(const uint8_t* row, int, int, int kk, uint4& o0, uint4& o1) {
        const uint4 a = *reinterpret_cast<const uint4*>(row + 32 * kk);
        const uint4 b = *reinterpret_cast<const uint4*>(row + 32 * kk + 16);
        o0 = make_uint4(cvt(a.x), cvt(a.y), cvt(a.z), cvt(a.w));
        o1 = make_uint4(cvt(b.x), cvt(b.y), cvt(b.z), cvt(b.w));
    }
};

// ---------------------------------------------------------------- the kernel

struct GemmParams {
    const uint8_t* w;      // weight rows (expert e starts at w + e * expert_bytes)
    const __half* x;       // activations, logical row r = x row (x_rows ? x_rows[r] : r)
    const __half* x_lo;    // split formats (F16, BF16): x's lo plane f16(x - f32(hi)), laid out
                           // like x (same ldx, gathered the same way); unused otherwise
    const int* x_rows;     // optional row gather (MoE slots -> tokens, LM head positions)
    float* y;              // output rows, or split-K partials at y + z * split_stride
    const int4* tiles;     // grouped mode: per blockIdx.y {expert, row_begin, row_end, 0}
    const int* num_tiles;  // grouped mode: how many entries of `tiles` are valid
    long long row_bytes;   // bytes per weight row
    long long expert_bytes;
    long long ldx;         // halves between x rows
    long long ldy;         // floats between y rows
    long long split_stride;
    int rows;              // logical rows (tokens) when not grouped
    int n_out;
    int k;                 // n_in, a multiple of 64
    int steps_per_split;   // 64-wide K steps per grid.z slice, a multiple of RS
};
// The Rust backend fills this block byte for byte (src/backend/cuda/ops/gemm.rs, `GemmParams`).
static_assert(sizeof(GemmParams) == 112 && offsetof(GemmParams, row_bytes) == 56 && offsetof(GemmParams, rows) == 96,
              "GemmParams layout is mirrored in src/backend/cuda/ops/gemm.rs");

template <int S, int RS>
struct RawSlots {
    // Slot of super-step r is r % N. Raw super-step r is issued S - 1 groups before its first
    // step (group r RS - 1) and last read while dequantizing step (r + 1) RS - 1, so N slots are
    // safe when (N - 1) RS >= S - 1.
    static constexpr int N = ((S - 1 + RS - 1) / RS + 1) < 2 ? 2 : ((S - 1 + RS - 1) / RS + 1);
};

template <int FMT, int MT, int NT, int WM, int WN, int S>
struct GemmCfg {
    using F = FmtInfo<FMT>;
    static constexpr int BM = WM * MT * 16, BN = WN * NT * 8, NTH = WM * WN * 32;
    static constexpr int RSLOTS = RawSlots<S, F::RS>::N;
    // x stages: S tiles of BM x 64 f16, then (split formats) the S tiles of the lo plane.
    static constexpr int XPLANE = S * BM * 128;
    static constexpr int XS_BYTES = (F::SPLIT ? 2 : 1) * XPLANE, WS_BYTES = 2 * BN * 128,
                         RAW_BYTES = RSLOTS * BN * F::RAWB;
    static constexpr int SMEM = XS_BYTES + WS_BYTES + RAW_BYTES;
};

template <int FMT, int MT, int NT, int WM, int WN, int S>
static __device__ __forceinline__ void gemm_body(const GemmParams& p) {
    using C = GemmCfg<FMT, MT, NT, WM, WN, S>;
    using F = typename C::F;
    constexpr int BM = C::BM, BN = C::BN, NTH = C::NTH, RS = F::RS, RSLOTS = C::RSLOTS;
    static_assert(NTH == BN, "one dequantizing thread per weight row");
    static_assert((BM * 8) % NTH == 0, "x tile copies split evenly");
    static_assert(NT % 2 == 0, "B fragments load two n8 tiles at a time");
    static_assert(S >= 2, "at least double buffering");

    PF_DYN_SMEM(smem);
    uint8_t* const xs = smem;
    uint8_t* const wsm = smem + C::XS_BYTES;
    uint8_t* const raw = wsm + C::WS_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;

    const uint8_t* W = p.w;
    int m_begin, m_end;
    if (p.tiles != nullptr) {
        if (static_cast<int>(blockIdx.y) >= *p.num_tiles) return;  // whole block: before any barrier
        const int4 t = p.tiles[blockIdx.y];
        W += static_cast<long long>(t.x) * p.expert_bytes;
        m_begin = t.y;
        m_end = t.z;
    } else {
        m_begin = blockIdx.y * BM;
        m_end = min(p.rows, m_begin + BM);
    }
    const int n0 = blockIdx.x * BN;
    const int kb = blockIdx.z * p.steps_per_split;
    const int n = max(0, min(p.k / 64 - kb, p.steps_per_split));
    const int ss0 = kb / RS;
    float* const Y = p.y + static_cast<long long>(blockIdx.z) * p.split_stride;

    // This thread's x copies (fixed for the whole K loop): logical row m, 16-byte chunk c, at
    // element offset xoff of x (and of x_lo: the lo plane is gathered through the same rows).
    constexpr int XCP = BM * 8 / NTH;
    long long xoff[XCP];
    int xdst[XCP], xbytes[XCP];
#pragma unroll
    for (int i = 0; i < XCP; i++) {
        const int idx = tid + i * NTH, m = idx >> 3, c = idx & 7, gm = m_begin + m;
        const bool ok = gm < m_end;
        const long long xr = ok ? (p.x_rows != nullptr ? p.x_rows[gm] : gm) : 0;
        xoff[i] = xr * p.ldx + c * 8;
        xdst[i] = m * 128 + ((c ^ (m & 7)) << 4);
        xbytes[i] = ok ? 16 : 0;
    }
    auto issue_x = [&](int slot, int step) {
#pragma unroll
        for (int i = 0; i < XCP; i++) {
            cp_async16(xs + slot * (BM * 128) + xdst[i], p.x + xoff[i] + step * 64, xbytes[i]);
            if constexpr (F::SPLIT)
                cp_async16(xs + C::XPLANE + slot * (BM * 128) + xdst[i], p.x_lo + xoff[i] + step * 64, xbytes[i]);
        }
    };
    // Raw super-step ss of the BN weight rows: the 16-byte chunks covering each row's bytes
    // [ss SB, ss SB + len); chunks past them and rows past n_out are zero-filled.
    auto issue_raw = [&](int slot, int ss) {
        const long long start_off = static_cast<long long>(ss) * F::SB;
        const long long rem = p.row_bytes - start_off;
        const int len = rem < F::SB ? static_cast<int>(rem) : F::SB;
#pragma unroll 1  // once per super-step: keep it small rather than fast (registers)
        for (int i = 0; i < F::NCH; i++) {  // BN * NCH copies, NCH per thread (NTH == BN)
            const int idx = tid + i * NTH, r = idx / F::NCH, ch = idx - r * F::NCH, nrow = n0 + r;
            const uint8_t* src = W;
            int bytes = 0;
            if (nrow < p.n_out) {
                const uint8_t* start = W + static_cast<long long>(nrow) * p.row_bytes + start_off;
                const int off = static_cast<int>(reinterpret_cast<uintptr_t>(start) & 15);
                if (ch * 16 < off + len) {
                    src = start - off + ch * 16;
                    bytes = 16;
                }
            }
            cp_async16(raw + (slot * BN + r) * F::RAWB + ch * 16, src, bytes);
        }
    };
    // The dequantizing thread's row.
    const uint8_t* const my_row = W + static_cast<long long>(n0 + tid) * p.row_bytes;
    auto deq_unit = [&](int step, int kk) {
        const int ss = ss0 + step / RS, sub = step % RS, slot = (step / RS) % RSLOTS;
        const uint8_t* rrow = raw + (slot * BN + tid) * F::RAWB;
        const int off = F::ALIGNED ? 0
                                   : static_cast<int>(reinterpret_cast<uintptr_t>(
                                                          my_row + static_cast<long long>(ss) * F::SB) &
                                                      15);
        uint4 o0, o1;
        Deq<FMT>::unit(rrow, off, sub, kk, o0, o1);
        uint8_t* wrow = wsm + (step & 1) * (BN * 128) + tid * 128;
        *reinterpret_cast<uint4*>(wrow + (((2 * kk) ^ (tid & 7)) << 4)) = o0;
        *reinterpret_cast<uint4*>(wrow + (((2 * kk + 1) ^ (tid & 7)) << 4)) = o1;
    };

    // ldmatrix row offsets (bytes) and chunk selectors of this lane.
    const int l7 = lane & 7;
    int arow[MT], brow[NT / 2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) arow[mt] = (wm * MT * 16 + mt * 16 + l7 + 8 * ((lane >> 3) & 1)) * 128;
#pragma unroll
    for (int np = 0; np < NT / 2; np++) brow[np] = (wn * NT * 8 + np * 16 + l7 + 8 * (lane >> 4)) * 128;
    const int ahi = lane >> 4, bhi = (lane >> 3) & 1;

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;

    // Group j (j >= 0) holds x step j and, when step j + 1 starts a super-step, that raw
    // super-step; group 0 also holds raw super-step 0. Group j is complete at iteration j.
#pragma unroll
    for (int j = 0; j < S - 1; j++) {
        if (j == 0 && n > 0) issue_raw(0, ss0);
        if (j < n) issue_x(j, kb + j);
        if ((j + 1) % RS == 0 && j + 1 < n) issue_raw(((j + 1) / RS) % RSLOTS, ss0 + (j + 1) / RS);
        cp_async_commit();
    }
    cp_async_wait<S - 2>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) deq_unit(0, kk);

    for (int i = 0; i < n; i++) {
        cp_async_wait<S - 2>();
        __syncthreads();  // x step i landed, f16 weights of step i written, step i-1 reads done
        {
            const int j = i + S - 1;
            if (j < n) issue_x(j % S, kb + j);
            if ((j + 1) % RS == 0 && j + 1 < n) issue_raw(((j + 1) / RS) % RSLOTS, ss0 + (j + 1) / RS);
            cp_async_commit();
        }
        const uint8_t* xcur = xs + (i % S) * (BM * 128);
        const uint8_t* wcur = wsm + (i & 1) * (BN * 128);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a[MT][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], xcur + arow[mt] + (((2 * kk + ahi) ^ l7) << 4));
#pragma unroll
            for (int np = 0; np < NT / 2; np++)
                ldsm_x4(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                        wcur + brow[np] + (((2 * kk + bhi) ^ l7) << 4));
            // Dequantize a quarter of the next step while the tensor cores work on this one (the
            // last iteration decodes a step that does not exist from stale shared memory; its
            // output buffer is never read).
            deq_unit(i + 1, kk);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_f16(acc[mt][nt], a[mt], b[nt]);
            if constexpr (F::SPLIT) {
                // The lo plane of the same x fragments, against the same weight fragments.
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                            xcur + C::XPLANE + arow[mt] + (((2 * kk + ahi) ^ l7) << 4));
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) mma_f16(acc[mt][nt], a[mt], b[nt]);
            }
        }
    }
    cp_async_wait<0>();
    // The main loop is done: let the next kernel (the split-K reduce, a norm, the next product)
    // be scheduled now, so that its launch overlaps this grid's epilogue and tail. It is only
    // scheduled once every CTA of this grid has got here (later waves have not), so it takes no
    // SM slot this grid still needs, and it waits in pdl_wait until this grid has finished.
    pdl_trigger();

    const int g = lane >> 2, t4 = lane & 3;
    const bool vec = ((p.ldy | p.split_stride) & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = m_begin + wm * MT * 16 + mt * 16 + g + 8 * h;
            if (row >= m_end) continue;
            float* yr = Y + static_cast<long long>(row) * p.ldy;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int col = n0 + wn * NT * 8 + nt * 8 + 2 * t4;
                const float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
                if (vec && col + 1 < p.n_out) {
                    *reinterpret_cast<float2*>(yr + col) = make_float2(v0, v1);
                } else {
                    if (col < p.n_out) yr[col] = v0;
                    if (col + 1 < p.n_out) yr[col + 1] = v1;
                }
            }
        }
}

// Tile configurations: A 128x256 (8 warps of 64x64), B 128x128 (4 warps of 64x64),
// C 32x128 (4 warps of 32x32; small batches and MoE experts).
#define PF_CFG_A 4, 8, 2, 4, 2
#define PF_CFG_B 4, 8, 2, 2, 2
#define PF_CFG_C 2, 4, 1, 4, 3

}  // namespace pf

// Heavy kernels wait for their inputs (dependent launch) but never let the next kernel start
// early: its CTAs would take SM slots that later waves of this grid need.
#define PF_GEMM_KERNEL(NAME, FMT, CFG, NTH)                                                      \
    extern "C" __global__ void __launch_bounds__(NTH, 1) NAME(pf::GemmParams p) {              \
        pf::pdl_wait();                                                                        \
        pf::gemm_body<FMT, CFG>(p);                                                            \
    }

#define PF_GEMM_FMT(SUFFIX, FMT)                                      \
    PF_GEMM_KERNEL(pf_gemm_##SUFFIX##_a, pf::FMT, PF_CFG_A, 256)      \
    PF_GEMM_KERNEL(pf_gemm_##SUFFIX##_b, pf::FMT, PF_CFG_B, 128)      \
    PF_GEMM_KERNEL(pf_gemm_##SUFFIX##_c, pf::FMT, PF_CFG_C, 128)

#ifndef PF_GEMM_SKIP_Q4K
PF_GEMM_FMT(q4k, FMT_Q4K)
#endif
#ifndef PF_GEMM_SKIP_Q5K
PF_GEMM_FMT(q5k, FMT_Q5K)
#endif
#ifndef PF_GEMM_SKIP_Q6K
PF_GEMM_FMT(q6k, FMT_Q6K)
#endif
#ifndef PF_GEMM_SKIP_Q80
PF_GEMM_FMT(q80, FMT_Q80)
#endif
#ifndef PF_GEMM_SKIP_F16
PF_GEMM_FMT(f16, FMT_F16)
#endif
#ifndef PF_GEMM_SKIP_BF16
PF_GEMM_FMT(bf16, FMT_BF16)
#endif

// The small kernels around the GEMMs take one parameter struct each (the Rust backend passes one
// parameter block per launch, src/backend/cuda/ops/gemm.rs mirrors these layouts).
namespace pf {
struct ReduceParams {
    const float* ws;  // [splits][rows][n] partial products
    float* y;         // rows of n at stride ldy
    long long ldy;
    int rows, n, splits;
};
struct CvtParams {
    const float* x;
    __half* y;    // f16(x)
    __half* lo;   // optional: f16(x - f16(x)), the lo plane of the split formats' products, or null
    long long n;
};
struct SwigluParams {
    const float* gate;
    const float* up;
    __half* h;    // f16(silu(gate) * up)
    __half* lo;   // optional: the lo plane of h (as CvtParams::lo), or null
    float* out;   // optional: the same values in f32 (the op's f32 output), or null
    long long n;
};
static_assert(sizeof(ReduceParams) == 40 && sizeof(CvtParams) == 32 && sizeof(SwigluParams) == 48,
              "mirrored in src/backend/cuda/ops/gemm.rs and src/backend/cuda/shadow.rs");
}  // namespace pf

// Sum of `splits` partial products (ws [splits][rows][n], packed) into y (row stride ldy), in
// split order (deterministic). One thread per 4 consecutive outputs of a row when n % 4 == 0.
extern "C" __global__ void pf_gemm_splitk_reduce(pf::ReduceParams p) {
    pf::kernel_start();
    const float* __restrict__ ws = p.ws;
    float* __restrict__ y = p.y;
    const int rows = p.rows, n = p.n, splits = p.splits;
    const long long ldy = p.ldy;
    const long long plane = static_cast<long long>(rows) * n;
    if ((n & 3) == 0 && (ldy & 3) == 0) {
        const long long nv = plane / 4;
        for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < nv;
             i += static_cast<long long>(gridDim.x) * blockDim.x) {
            float4 s = reinterpret_cast<const float4*>(ws)[i];
            for (int z = 1; z < splits; z++) {
                const float4 v = reinterpret_cast<const float4*>(ws + z * plane)[i];
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            const long long e = i * 4, r = e / n, c = e - r * n;
            *reinterpret_cast<float4*>(y + r * ldy + c) = s;
        }
    } else {
        for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < plane;
             i += static_cast<long long>(gridDim.x) * blockDim.x) {
            float s = ws[i];
            for (int z = 1; z < splits; z++) s += ws[z * plane + i];
            const long long r = i / n, c = i - r * n;
            y[r * ldy + c] = s;
        }
    }
}

// f32 -> f16 (round to nearest) of n values; activations for the GEMM, K/V rows for attention.
// |x| > 65504 becomes inf: the f16 tier assumes normalised activations. With `lo`, also the lo
// plane f16(x - f32(hi)) that the split formats' products add (x - hi is exact in f32). x 16-byte,
// y and lo 8-byte aligned.
extern "C" __global__ void pf_f32_to_f16(pf::CvtParams p) {
    pf::kernel_start();
    const float* __restrict__ x = p.x;
    __half* __restrict__ y = p.y;
    __half* __restrict__ lo = p.lo;
    const long long n = p.n;
    const long long nv = n / 4;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < nv;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        uint2 o;
        o.x = pf::pack_half2(v.x, v.y);
        o.y = pf::pack_half2(v.z, v.w);
        reinterpret_cast<uint2*>(y)[i] = o;
        if (lo != nullptr) {
            uint2 l;
            l.x = pf::lo_half2(v.x, v.y, o.x);
            l.y = pf::lo_half2(v.z, v.w, o.y);
            reinterpret_cast<uint2*>(lo)[i] = l;
        }
    }
    for (long long i = nv * 4 + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const __half h = __float2half_rn(x[i]);
        y[i] = h;
        if (lo != nullptr) lo[i] = __float2half_rn(x[i] - __half2float(h));
    }
}

// h = f16(silu(gate) * up) over n values (the input of the down projection); with `lo`, its lo
// plane (as pf_f32_to_f16); with `out`, the f32 values too (the op's output, from the same f32
// product that h rounds).
extern "C" __global__ void pf_swiglu_f16(pf::SwigluParams p) {
    pf::kernel_start();
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < p.n;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const float g = p.gate[i];
        const float v = g / (1.0f + __expf(-g)) * p.up[i];
        const __half h = __float2half_rn(v);
        p.h[i] = h;
        if (p.lo != nullptr) p.lo[i] = __float2half_rn(v - __half2float(h));
        if (p.out != nullptr) p.out[i] = v;
    }
}
