// formats.cuh: the GGUF weight formats, decoded in registers.
//
// A *unit* is 32 consecutive elements of a weight row: unit k lies in block k / UNITS of the row
// (UNITS = block elements / 32) at sub-block k % UNITS. Every format provides
//   dec(b, sub, y)      the 32 dequantized values of sub-block `sub` of the block at b, computed
//                       with the f32 operations of the CPU reference (src/quant/*.rs) in the same
//                       order, so they are bit-identical to `quant::dequantize`;
//   dot(b, sub, x, sx)  sum_i y_i * x_i over the same 32 values, where sx holds the sums of
//                       x[0..16) and x[16..32). The products are the same numbers summed in another
//                       order and factored (d * sum(q*x) + c * sum(x) instead of sum((d*q + c)*x)),
//                       which differs from the reference only by f32 rounding of the sum.
// Most formats are "scaled integers": the unit's 32 quants q (small unsigned integers, packed one
// per byte in 8 words) give y = (q - BIAS) * d (+ c with a minimum) with a scale d and constant c
// per half unit; such a format only writes `load`, and `QFmt` derives dec and dot. Quants become
// floats through `bytes4` (exact, no integer-to-float unit). Codebook formats (IQ4, MXFP4) and
// plain floats write dec and dot themselves. Plain float formats use "blocks" of 32 elements; only
// their last unit of a row can be partial (rows of any length), handled by `elem`.
//
// Layouts: spec/GGUF.md section 3 and ggml's reference C code (mirrored in src/quant/).
#pragma once

#include "common.cuh"

// sum_{i<4N} (byte i of w, minus bias) * x[i]; two accumulators for instruction-level parallelism.
template <int N>
__device__ __forceinline__ float qdot(const uint32_t* w, float bias, const float* x) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        float a, b, c, d;
        bytes4(w[i], bias, a, b, c, d);
        s0 = fmaf(a, x[4 * i + 0], s0);
        s1 = fmaf(b, x[4 * i + 1], s1);
        s0 = fmaf(c, x[4 * i + 2], s0);
        s1 = fmaf(d, x[4 * i + 3], s1);
    }
    return s0 + s1;
}

template <int N>
__device__ __forceinline__ void mask_words(const uint32_t (&w)[N], int shift, uint32_t mask, uint32_t (&o)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = (w[i] >> shift) & mask;
}

// The scale and constant of each half of a unit: y = (q - BIAS) * d[h] + c[h].
struct Scales {
    float d[2], c[2];
};

// A scaled-integer format L: L::load(b, sub, q, s) fills the unit's quants and scales; L::BIAS
// is subtracted from every quant, L::MIN says whether c is used.
template <class L>
struct QFmt {
    static constexpr bool FLOAT = false;
    __device__ static void dec(const uint8_t* b, int sub, float (&y)[32]) {
        uint32_t q[8];
        Scales s;
        L::load(b, sub, q, s);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float v[4];
            bytes4(q[i], L::BIAS, v[0], v[1], v[2], v[3]);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int h = i / 4;  // elements 0..15 and 16..31
                const float p = __fmul_rn(v[k], s.d[h]);
                y[4 * i + k] = L::MIN ? __fadd_rn(p, s.c[h]) : p;
            }
        }
    }
    __device__ static float dot(const uint8_t* b, int sub, const float (&x)[32], float2 sx) {
        uint32_t q[8];
        Scales s;
        L::load(b, sub, q, s);
        return dot_loaded(q, s, x, sx);
    }
    // The dot product of a unit already loaded by L::load (kernels that issue the loads of several
    // rows before any arithmetic, so that they are all in flight at once).
    __device__ static float dot_loaded(const uint32_t (&q)[8], const Scales& s, const float (&x)[32], float2 sx) {
        float r = s.d[0] * qdot<4>(q, L::BIAS, x) + s.d[1] * qdot<4>(q + 4, L::BIAS, x + 16);
        if (L::MIN) r += s.c[0] * sx.x + s.c[1] * sx.y;
        return r;
    }
};

// Formats that decode element by element (codebooks): dot from dec.
template <class L>
struct DecFmt {
    static constexpr bool FLOAT = false;
    __device__ static float dot(const uint8_t* b, int sub, const float (&x)[32], float2) {
        float y[32];
        L::dec(b, sub, y);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            s0 = fmaf(y[i], x[i], s0);
            s1 = fmaf(y[i + 1], x[i + 1], s1);
        }
        return s0 + s1;
    }
};

// ---------------------------------------------------------------------------------------------
// Plain floats.

struct FmtF32 {
    static constexpr int QK = 32, BYTES = 128, UNITS = 1;
    static constexpr bool FLOAT = true;
    __device__ static float elem(const uint8_t* row, int i) { return reinterpret_cast<const float*>(row)[i]; }
    // A unit's 32 floats: 16-byte loads where the row allows (rows of a multiple of 4 floats), as
    // the quantized formats load their blocks; else one float at a time (an F32 router took 11 us
    // per 2 MB on the H200 with 32 loads of 4 bytes per unit).
    __device__ static void load(const uint8_t* b, float (&w)[32]) {
        const float* f = reinterpret_cast<const float*>(b);
        if ((reinterpret_cast<uintptr_t>(f) & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(f) + i);
                w[4 * i] = v.x;
                w[4 * i + 1] = v.y;
                w[4 * i + 2] = v.z;
                w[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; ++i) w[i] = __ldg(f + i);
        }
    }
    __device__ static void dec(const uint8_t* b, int, float (&y)[32]) { load(b, y); }
    __device__ static float dot(const uint8_t* b, int, const float (&x)[32], float2) {
        float w[32];
        load(b, w);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            s0 = fmaf(w[i], x[i], s0);
            s1 = fmaf(w[i + 1], x[i + 1], s1);
        }
        return s0 + s1;
    }
};

// F16 and BF16: 16 words of two values each; `HALF(h)` converts one 16-bit value.
template <float (*HALF)(uint32_t)>
struct Fmt16 : DecFmt<Fmt16<HALF>> {
    static constexpr int QK = 32, BYTES = 64, UNITS = 1;
    static constexpr bool FLOAT = true;
    __device__ static float elem(const uint8_t* row, int i) { return HALF(ld_u16(row + 2 * i)); }
    __device__ static void dec(const uint8_t* b, int, float (&y)[32]) {
        uint32_t w[16];
        ldwin<16>(b, w);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            y[2 * i] = HALF(w[i] & 0xFFFFu);
            y[2 * i + 1] = HALF(w[i] >> 16);
        }
    }
};
using FmtF16 = Fmt16<f16_to_f32>;
using FmtBF16 = Fmt16<bf16_to_f32>;

// ---------------------------------------------------------------------------------------------
// The 32-element legacy formats. Element j (< 16) is the low nibble of qs[j], element j + 16 its
// high nibble: words 0..3 of the unit's quants are the low nibbles of qs, words 4..7 the high.

// The 32 nibbles of qs[16] at p, low nibbles first.
__device__ __forceinline__ void nibbles16(const uint8_t* p, uint32_t (&q)[8]) {
    uint32_t w[4];
    ldwin<4>(p, w);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q[i] = w[i] & 0x0F0F0F0Fu;
        q[i + 4] = (w[i] >> 4) & 0x0F0F0F0Fu;
    }
}

// Add the 5th bits (bit j of the 32-bit word at qh_p for element j) at bit 4 of each quant.
__device__ __forceinline__ void fifth_bits(const uint8_t* qh_p, uint32_t (&q)[8]) {
    uint32_t h[1];
    ldwin<1>(qh_p, h);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] |= spread4(h[0] >> (4 * i)) << 4;
}

__device__ __forceinline__ Scales scales1(float d, float c) { return Scales{{d, d}, {c, c}}; }

// Q4_0 (18 bytes): d f16, qs[16]. y = (q - 8) * d.
struct FmtQ4_0 : QFmt<FmtQ4_0> {
    static constexpr int QK = 32, BYTES = 18, UNITS = 1;
    static constexpr float BIAS = 8.0f;
    static constexpr bool MIN = false;
    __device__ static void load(const uint8_t* b, int, uint32_t (&q)[8], Scales& s) {
        nibbles16(b + 2, q);
        s = scales1(f16_to_f32(ld_u16(b)), 0.0f);
    }
};

// Q4_1 (20 bytes): d f16, m f16, qs[16]. y = q * d + m.
struct FmtQ4_1 : QFmt<FmtQ4_1> {
    static constexpr int QK = 32, BYTES = 20, UNITS = 1;
    static constexpr float BIAS = 0.0f;
    static constexpr bool MIN = true;
    __device__ static void load(const uint8_t* b, int, uint32_t (&q)[8], Scales& s) {
        nibbles16(b + 4, q);
        s = scales1(f16_to_f32(ld_u16(b)), f16_to_f32(ld_u16(b + 2)));
    }
};

// Q5_0 (22 bytes): d f16, qh u32 (bit j = 5th bit of element j), qs[16]. y = (q5 - 16) * d.
struct FmtQ5_0 : QFmt<FmtQ5_0> {
    static constexpr int QK = 32, BYTES = 22, UNITS = 1;
    static constexpr float BIAS = 16.0f;
    static constexpr bool MIN = false;
    __device__ static void load(const uint8_t* b, int, uint32_t (&q)[8], Scales& s) {
        nibbles16(b + 6, q);
        fifth_bits(b + 2, q);
        s = scales1(f16_to_f32(ld_u16(b)), 0.0f);
    }
};

// Q5_1 (24 bytes): d f16, m f16, qh u32, qs[16]. y = q5 * d + m.
struct FmtQ5_1 : QFmt<FmtQ5_1> {
    static constexpr int QK = 32, BYTES = 24, UNITS = 1;
    static constexpr float BIAS = 0.0f;
    static constexpr bool MIN = true;
    __device__ static void load(const uint8_t* b, int, uint32_t (&q)[8], Scales& s) {
        nibbles16(b + 8, q);
        fifth_bits(b + 4, q);
        s = scales1(f16_to_f32(ld_u16(b)), f16_to_f32(ld_u16(b + 2)));
    }
};

// Q8_0 (34 bytes): d f16, qs int8[32]. y = q * d. Flipping the sign bit maps int8 q to the
// unsigned byte q + 128, hence bias 128.
struct FmtQ8_0 : QFmt<FmtQ8_0> {
    static constexpr int QK = 32, BYTES = 34, UNITS = 1;
    static constexpr float BIAS = 128.0f;
    static constexpr bool MIN = false;
    __device__ static void load(const uint8_t* b, int, uint32_t (&q)[8], Scales& s) {
        ldwin<8>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] ^= 0x80808080u;
        s = scales1(f16_to_f32(ld_u16(b)), 0.0f);
    }
};

// ---------------------------------------------------------------------------------------------
// Codebook formats.

// Codebook lookup of 4-bit indices without memory: the 16 signed byte values live in four
// words; __byte_perm picks byte (idx & 7) of a word pair, bit 3 picks the pair.
__device__ __forceinline__ float lut16(uint32_t idx, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t lo = __byte_perm(t0, t1, idx & 7u), hi = __byte_perm(t2, t3, idx & 7u);
    const int v = (int)(int8_t)(uint8_t)((idx & 8u) ? hi : lo);
    return (float)v;
}

// y[j] = scale (*) V(low nibble of qs[j]), y[j + 16] = scale (*) V(high nibble), with the 16 bytes
// of qs at p; `scale_first` orders the product as the CPU reference does.
template <float (*V)(uint32_t), bool SCALE_FIRST>
__device__ __forceinline__ void dec_codebook(const uint8_t* p, float scale, float (&y)[32]) {
    uint32_t w[4];
    ldwin<4>(p, w);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const uint32_t q = (w[j / 4] >> (8 * (j % 4))) & 0xFFu;
        const float a = V(q & 0xFu), b = V(q >> 4);
        y[j] = SCALE_FIRST ? __fmul_rn(scale, a) : __fmul_rn(a, scale);
        y[j + 16] = SCALE_FIRST ? __fmul_rn(scale, b) : __fmul_rn(b, scale);
    }
}

// MXFP4 (17 bytes): e8m0 exponent e, qs[16] of e2m1 codes. y = V[q] * 2^(e-128), V the e2m1
// values doubled (0,1,2,3,4,6,8,12 and negatives), as src/quant/legacy.rs.
__device__ __forceinline__ float mxfp4_val(uint32_t q) { return lut16(q, 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu); }

struct FmtMXFP4 : DecFmt<FmtMXFP4> {
    static constexpr int QK = 32, BYTES = 17, UNITS = 1;
    __device__ static float scale(uint32_t e) {
        const uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1u) << 23);
        return __uint_as_float(bits);
    }
    __device__ static void dec(const uint8_t* b, int, float (&y)[32]) { dec_codebook<mxfp4_val, false>(b + 1, scale(ld_u8(b)), y); }
};

// IQ4_NL (18 bytes): d f16, qs[16] of indices into ggml's kvalues_iq4nl. y = d * kv[q].
// kvalues: -127,-104,-83,-65 | -49,-35,-22,-10 | 1,13,25,38 | 53,69,89,113.
__device__ __forceinline__ float iq4_kv(uint32_t q) { return lut16(q, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u); }

struct FmtIQ4_NL : DecFmt<FmtIQ4_NL> {
    static constexpr int QK = 32, BYTES = 18, UNITS = 1;
    __device__ static void dec(const uint8_t* b, int, float (&y)[32]) { dec_codebook<iq4_kv, true>(b + 2, f16_to_f32(ld_u16(b)), y); }
};

// IQ4_XS (136 bytes): d f16, scales_h u16, scales_l[4], qs[128]. Sub-block ib: 6-bit scale
// ls = (scales_l nibble) | (2 bits of scales_h) << 4, dl = d * (ls - 32), y = dl * kv[q] with the
// 32 values' indices in qs[16ib .. 16ib+16] (low nibbles first 16, high nibbles next 16).
struct FmtIQ4_XS : DecFmt<FmtIQ4_XS> {
    static constexpr int QK = 256, BYTES = 136, UNITS = 8;
    __device__ static void dec(const uint8_t* b, int ib, float (&y)[32]) {
        const float d = f16_to_f32(ld_u16(b));
        const uint32_t lo = (ld_u8(b + 4 + ib / 2) >> (4 * (ib % 2))) & 0xFu;
        const uint32_t hi = (ld_u16(b + 2) >> (2 * ib)) & 3u;
        const float dl = __fmul_rn(d, (float)((int)(lo | (hi << 4)) - 32));
        dec_codebook<iq4_kv, true>(b + 8 + 16 * ib, dl, y);
    }
};

// ---------------------------------------------------------------------------------------------
// K-quants: 256-element super-blocks, 8 units each.

// Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64], d f16, dmin f16.
// Unit u = 4h + s: elements 128h + 32s + 16half + l use q = (qs[32h + 16half + l] >> 2s) & 3 and
// sc = scales[8h + 2s + half]; y = (d*(sc & 15)) * q - dmin*(sc >> 4).
struct FmtQ2_K : QFmt<FmtQ2_K> {
    static constexpr int QK = 256, BYTES = 84, UNITS = 8;
    static constexpr float BIAS = 0.0f;
    static constexpr bool MIN = true;
    __device__ static void load(const uint8_t* b, int u, uint32_t (&q)[8], Scales& s) {
        const int h = u / 4, sh = u % 4;
        const float d = f16_to_f32(ld_u16(b + 80)), dmin = f16_to_f32(ld_u16(b + 82));
        uint32_t w[8];
        ldwin<8>(b + 16 + 32 * h, w);
        mask_words(w, 2 * sh, 0x03030303u, q);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t sc = ld_u8(b + 8 * h + 2 * sh + half);
            s.d[half] = __fmul_rn(d, (float)(sc & 0xFu));
            s.c[half] = -__fmul_rn(dmin, (float)(sc >> 4));
        }
    }
};

// Q3_K's 6-bit signed scale k (ggml: low 4 bits from scales[k] or scales[k-8] >> 4, high 2 bits
// from scales[8 + k%4] >> 2(k/4)), minus 32.
__device__ __forceinline__ int q3k_scale(const uint8_t* s, int k) {
    const uint32_t low4 = k < 8 ? (ld_u8(s + k) & 0xFu) : (ld_u8(s + k - 8) >> 4);
    const uint32_t high2 = (ld_u8(s + 8 + (k % 4)) >> (2 * (k / 4))) & 3u;
    return (int)(low4 | (high2 << 4)) - 32;
}

// Q3_K (110 bytes): hmask[32], qs[64], scales[12], d f16. Unit u = 4h + s: element 32u + ll
// (ll < 32) has q = ((qs[32h + ll] >> 2s) & 3) - (hmask[ll] bit u set ? 0 : 4), scale
// sc[2u + ll/16]; y = (d * sc) * q. The quants are stored as q2 | hbit << 2 = q + 4, bias 4.
struct FmtQ3_K : QFmt<FmtQ3_K> {
    static constexpr int QK = 256, BYTES = 110, UNITS = 8;
    static constexpr float BIAS = 4.0f;
    static constexpr bool MIN = false;
    __device__ static void load(const uint8_t* b, int u, uint32_t (&q)[8], Scales& s) {
        const int h = u / 4, sh = u % 4;
        uint32_t w[8], hm[8];
        ldwin<8>(b + 32 + 32 * h, w);
        ldwin<8>(b, hm);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = ((w[i] >> (2 * sh)) & 0x03030303u) | (((hm[i] >> u) & 0x01010101u) << 2);
        const float d = f16_to_f32(ld_u16(b + 108));
        s.d[0] = __fmul_rn(d, (float)q3k_scale(b + 96, 2 * u));
        s.d[1] = __fmul_rn(d, (float)q3k_scale(b + 96, 2 * u + 1));
        s.c[0] = s.c[1] = 0.0f;
    }
};

// Scale and min of sub-block j from the 12 scale bytes held in the words s1, s2, s3 (header words
// 1..3 of a Q4_K/Q5_K block): ggml's get_scale_min_k4 without memory reads. Both branches are
// computed and one selected, as the lanes of a warp decode different sub-blocks.
__device__ __forceinline__ void scale_min_k4_regs(uint32_t s1, uint32_t s2, uint32_t s3, int j, uint32_t& sc, uint32_t& m) {
    const int sh = 8 * (j & 3);
    const uint32_t b1 = (s1 >> sh) & 0xFFu, b2 = (s2 >> sh) & 0xFFu, b3 = (s3 >> sh) & 0xFFu;
    // j < 4: scales[j] & 63, scales[j + 4] & 63 (bytes of s1 and s2).
    // j >= 4: (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4 and (scales[j + 4] >> 4) | (scales[j] >> 6) << 4,
    //         with scales[j + 4] in s3, scales[j - 4] in s1 and scales[j] in s2.
    const bool lo = j < 4;
    sc = lo ? (b1 & 63u) : ((b3 & 0xFu) | ((b1 >> 6) << 4));
    m = lo ? (b2 & 63u) : ((b3 >> 4) | ((b2 >> 6) << 4));
}

// The d*sc and -dmin*m of unit j of a Q4_K/Q5_K super-block from its first 16 bytes.
__device__ __forceinline__ Scales k4_scales(const uint32_t (&head)[4], int j) {
    const float d = f16_to_f32(head[0] & 0xFFFFu), dmin = f16_to_f32(head[0] >> 16);
    uint32_t sc, m;
    scale_min_k4_regs(head[1], head[2], head[3], j, sc, m);
    return scales1(__fmul_rn(d, (float)sc), -__fmul_rn(dmin, (float)m));
}

// Q4_K (144 bytes): d f16, dmin f16, scales[12], qs[128]. Unit j: qs[32c .. 32c+32] with
// c = j/2, low nibbles for even j, high for odd; y = (d*sc) * q - dmin*m. Super-blocks are
// 16-byte aligned (144 = 9 * 16 and buffers are 256-byte aligned): plain vector loads.
struct FmtQ4_K : QFmt<FmtQ4_K> {
    static constexpr int QK = 256, BYTES = 144, UNITS = 8;
    static constexpr float BIAS = 0.0f;
    static constexpr bool MIN = true;
    __device__ static void load(const uint8_t* b, int j, uint32_t (&q)[8], Scales& s) {
        uint32_t head[4], w[8];
        ld_aligned<4>(b, head);
        ld_aligned<8>(b + 16 + 32 * (j / 2), w);
        mask_words(w, 4 * (j & 1), 0x0F0F0F0Fu, q);
        s = k4_scales(head, j);
    }
};

// Q5_K (176 bytes, 16-byte aligned): d, dmin, scales[12], qh[32], qs[128]. As Q4_K plus a 5th
// bit: bit j of qh[l] for element l of unit j.
struct FmtQ5_K : QFmt<FmtQ5_K> {
    static constexpr int QK = 256, BYTES = 176, UNITS = 8;
    static constexpr float BIAS = 0.0f;
    static constexpr bool MIN = true;
    __device__ static void load(const uint8_t* b, int j, uint32_t (&q)[8], Scales& s) {
        uint32_t head[4], hb[8], w[8];
        ld_aligned<4>(b, head);
        ld_aligned<8>(b + 16, hb);
        ld_aligned<8>(b + 48 + 32 * (j / 2), w);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = ((w[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((hb[i] >> j) & 0x01010101u) << 4);
        s = k4_scales(head, j);
    }
};

// Q6_K (210 bytes): ql[128], qh[64], scales int8[16], d f16. Unit j = 4h + qq: element l < 32 has
// low 4 bits from ql[64h + 32(qq&1) + l] (low nibble for qq < 2, high for qq >= 2), high 2 bits
// (qh[32h + l] >> 2qq) & 3, q = that 6-bit value - 32, scale sc[8h + 2qq + l/16]; y = (d*sc) * q.
struct FmtQ6_K : QFmt<FmtQ6_K> {
    static constexpr int QK = 256, BYTES = 210, UNITS = 8;
    static constexpr float BIAS = 32.0f;
    static constexpr bool MIN = false;
    __device__ static void load(const uint8_t* b, int j, uint32_t (&q)[8], Scales& s) {
        const int h = j / 4, qq = j % 4;
        uint32_t lw[8], hw[8];
        ldwin<8>(b + 64 * h + 32 * (qq & 1), lw);
        ldwin<8>(b + 128 + 32 * h, hw);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = ((lw[i] >> (4 * (qq >> 1))) & 0x0F0F0F0Fu) | (((hw[i] >> (2 * qq)) & 0x03030303u) << 4);
        const float d = f16_to_f32(ld_u16(b + 208));
        s.d[0] = __fmul_rn(d, (float)(int8_t)ld_u8(b + 192 + 8 * h + 2 * qq));
        s.d[1] = __fmul_rn(d, (float)(int8_t)ld_u8(b + 192 + 8 * h + 2 * qq + 1));
        s.c[0] = s.c[1] = 0.0f;
    }
};

// ---------------------------------------------------------------------------------------------
// The list of formats, for instantiating one kernel per format: X(ggml name, struct). Kernels
// are named after the format as ggml prints it (`matvec_Q4_K`, `embed_BF16`).
#define FOR_EACH_FORMAT(X) \
    X(F32, FmtF32)         \
    X(F16, FmtF16)         \
    X(BF16, FmtBF16)       \
    X(Q4_0, FmtQ4_0)       \
    X(Q4_1, FmtQ4_1)       \
    X(Q5_0, FmtQ5_0)       \
    X(Q5_1, FmtQ5_1)       \
    X(Q8_0, FmtQ8_0)       \
    X(Q2_K, FmtQ2_K)       \
    X(Q3_K, FmtQ3_K)       \
    X(Q4_K, FmtQ4_K)       \
    X(Q5_K, FmtQ5_K)       \
    X(Q6_K, FmtQ6_K)       \
    X(IQ4_NL, FmtIQ4_NL)   \
    X(IQ4_XS, FmtIQ4_XS)   \
    X(MXFP4, FmtMXFP4)

// Decode unit k (elements [32k, 32k+32)) of a row into y; for plain floats, elements at or past
// n_in (only in a row's last unit) read as 0 without touching memory.
template <class F>
__device__ __forceinline__ void dec_unit(const uint8_t* row, int k, int n_in, float (&y)[32]) {
    if constexpr (F::FLOAT) {
        if (32 * k + 32 > n_in) {
#pragma unroll
            for (int i = 0; i < 32; ++i) y[i] = (32 * k + i < n_in) ? F::elem(row, 32 * k + i) : 0.0f;
            return;
        }
    }
    F::dec(row + (size_t)(k / F::UNITS) * F::BYTES, k % F::UNITS, y);
}

// sum over unit k of y_i * x_i; x[i] = 0 past n_in; sx = the sums of x[0..16) and x[16..32).
template <class F>
__device__ __forceinline__ float dot_unit(const uint8_t* row, int k, int n_in, const float (&x)[32], float2 sx) {
    if constexpr (F::FLOAT) {
        if (32 * k + 32 > n_in) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; ++i)
                if (32 * k + i < n_in) s = fmaf(F::elem(row, 32 * k + i), x[i], s);
            return s;
        }
    }
    return F::dot(row + (size_t)(k / F::UNITS) * F::BYTES, k % F::UNITS, x, sx);
}
