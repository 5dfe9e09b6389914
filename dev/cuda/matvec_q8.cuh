// matvec_q8.cuh: a retired candidate for the decode matrix-vector products of a fast precision
// tier, kept for dev/cuda/matvec_bench.cu (dev/cuda/DECISIONS.md, "Retired switches"): activations
// quantized to 8 bits per element with one f32 scale per 32 (ggml's Q8_1 idea), weights in their
// GGUF block formats, integer dot products with dp4a (4 multiply-adds per instruction).
//
// Why: the exact kernels (matvec.cuh) turn every quant into a float and multiply in f32, about
// 3.4 instructions per weight; at the H200's bandwidth that is most of the SMs' issue rate, so they
// stream weights at about a third of it. Here a unit of 32 weights costs 8 dp4a plus a few scale
// operations, and the weights of a row are read in *chunks* that use every loaded byte once (a
// Q4_K chunk is the 32 quant bytes of two units, low and high nibbles; a Q6_K chunk the 64 + 32
// bytes of four units), instead of loading shared bytes once per unit.
//
// Precision (Precision::Fast): x is rounded to q = rint(x * 127 / amax) per unit of 32, an error
// of at most amax / 254 per element; the integer sums are exact and the scales f32. The result is
// the exact dot product of the dequantized weights with the dequantized activations, up to f32
// rounding of a few terms per unit. ggml's quantized CUDA path (mmvq) makes the same trade.
//
// Geometry as matvec.cuh (row groups x unit lanes, RPT rows per thread), over chunks instead of
// units. Each block quantizes the activation vectors it needs into shared memory first (every
// block computes the same bytes; x comes from L2), so there is no extra launch per product.
// Batching (grid.y = output vectors), MoE expert ids, the k-way down sum and GLU as matvec.cuh.
#pragma once

#include "matvec.cuh"

// sum of 4 products of unsigned bytes of a with signed bytes of b, plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; ++i) c += (int)((a >> (8 * i)) & 0xFFu) * (int)(int8_t)((b >> (8 * i)) & 0xFFu);
    return c;
#endif
}

// sum of 4 products of signed bytes, plus c.
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)((a >> (8 * i)) & 0xFFu) * (int)(int8_t)((b >> (8 * i)) & 0xFFu);
    return c;
#endif
}

// One quantized activation vector in shared memory: units * 32 signed bytes, then the f32 scale
// of each unit, then the integer sums of each half unit (for the formats' biases and minimums).
struct XQ {
    const uint32_t* q;  // 8 words per unit
    const float* d;
    const int* s;  // 2 per unit
};

__host__ __device__ __forceinline__ int xq_bytes(int units) { return units * (32 + 4 + 8); }

__device__ __forceinline__ XQ xq_view(const uint8_t* base, int units) {
    return XQ{reinterpret_cast<const uint32_t*>(base), reinterpret_cast<const float*>(base + (size_t)units * 32),
              reinterpret_cast<const int*>(base + (size_t)units * 36)};
}

// Quantize x[0, n_in) (zero past n_in) into the record at base: one thread per unit of 32, no
// shuffles, so a 4096-wide vector takes one pass of 128 threads.
__device__ __forceinline__ void quantize_x(const float* x, int n_in, int units, uint8_t* base) {
    uint32_t* q = reinterpret_cast<uint32_t*>(base);
    float* d = reinterpret_cast<float*>(base + (size_t)units * 32);
    int* s = reinterpret_cast<int*>(base + (size_t)units * 36);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float v[32];
        if (32 * u + 32 <= n_in && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
            const float4* p = reinterpret_cast<const float4*>(x + 32 * u);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 f = p[i];
                v[4 * i] = f.x;
                v[4 * i + 1] = f.y;
                v[4 * i + 2] = f.z;
                v[4 * i + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; ++i) v[i] = 32 * u + i < n_in ? x[32 * u + i] : 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
        // amax == 0: every q is 0 (and the scale 0).
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int h0 = 0, h1 = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            uint32_t word = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int qi = __float2int_rn(__fmul_rn(v[4 * w + k], id));
                (w < 4 ? h0 : h1) += qi;
                word |= (uint32_t)(qi & 0xFF) << (8 * k);
            }
            q[8 * u + w] = word;
        }
        d[u] = amax / 127.0f;
        s[2 * u] = h0;
        s[2 * u + 1] = h1;
    }
}

// Unit u of a scaled-integer format (formats.cuh QFmt: quants q, scales s, BIAS, MIN) against
// the quantized activations: sum_h d_x * (d_h * (sum q*xq - BIAS * sum xq) + c_h * sum xq).
template <int BIAS, bool MIN>
__device__ __forceinline__ float q8_unit(const uint32_t (&q)[8], const Scales& s, const XQ& x, int u) {
    const uint4 a = reinterpret_cast<const uint4*>(x.q + 8 * u)[0];
    const uint4 b = reinterpret_cast<const uint4*>(x.q + 8 * u)[1];
    const int p0 = dp4a_us(q[3], a.w, dp4a_us(q[2], a.z, dp4a_us(q[1], a.y, dp4a_us(q[0], a.x, 0))));
    const int p1 = dp4a_us(q[7], b.w, dp4a_us(q[6], b.z, dp4a_us(q[5], b.y, dp4a_us(q[4], b.x, 0))));
    const int s0 = x.s[2 * u], s1 = x.s[2 * u + 1];
    float r = s.d[0] * (float)(p0 - BIAS * s0) + s.d[1] * (float)(p1 - BIAS * s1);
    if (MIN) r += s.c[0] * (float)s0 + s.c[1] * (float)s1;
    return x.d[u] * r;
}

// The dot product of one chunk of a weight row with the quantized activations.
//   CU: units per chunk. dot(row, chunk, xq): the sum over the chunk's units.
// Default: any scaled-integer format, one unit per chunk through F::load.
template <class F>
struct Q8Dot {
    static constexpr int CU = 1;
    __device__ static float dot(const uint8_t* row, int c, const XQ& x) {
        uint32_t q[8];
        Scales s;
        F::load(row + (size_t)(c / F::UNITS) * F::BYTES, c % F::UNITS, q, s);
        return q8_unit<(int)F::BIAS, F::MIN>(q, s, x, c);
    }
};

// Q8_0: the quants are signed bytes already; one block per chunk.
template <>
struct Q8Dot<FmtQ8_0> {
    static constexpr int CU = 1;
    __device__ static float dot(const uint8_t* row, int c, const XQ& x) {
        const uint8_t* b = row + (size_t)c * 34;
        uint32_t q[8];
        ldwin<8>(b + 2, q);
        const uint4 a0 = reinterpret_cast<const uint4*>(x.q + 8 * c)[0];
        const uint4 a1 = reinterpret_cast<const uint4*>(x.q + 8 * c)[1];
        int p = dp4a_ss(q[0], a0.x, dp4a_ss(q[1], a0.y, dp4a_ss(q[2], a0.z, dp4a_ss(q[3], a0.w, 0))));
        p = dp4a_ss(q[4], a1.x, dp4a_ss(q[5], a1.y, dp4a_ss(q[6], a1.z, dp4a_ss(q[7], a1.w, p))));
        return (f16_to_f32(ld_u16(b)) * x.d[c]) * (float)p;
    }
};

// Q4_K: chunk c of super-block c / 4 is the 32 quant bytes qs[32(c%4) ...]: unit 2(c%4) in the
// low nibbles, unit 2(c%4)+1 in the high ones. One 16-byte header load and two 16-byte quant loads.
template <>
struct Q8Dot<FmtQ4_K> {
    static constexpr int CU = 2;
    __device__ static float dot(const uint8_t* row, int c, const XQ& x) {
        const uint8_t* b = row + (size_t)(c / 4) * 144;
        const int cc = c % 4;
        uint32_t head[4], w[8], q[8];
        ld_aligned<4>(b, head);
        ld_aligned<8>(b + 16 + 32 * cc, w);
        mask_words(w, 0, 0x0F0F0F0Fu, q);
        float r = q8_unit<0, true>(q, k4_scales(head, 2 * cc), x, 2 * c);
        mask_words(w, 4, 0x0F0F0F0Fu, q);
        return r + q8_unit<0, true>(q, k4_scales(head, 2 * cc + 1), x, 2 * c + 1);
    }
};

// Q6_K: chunk c is half h = c % 2 of super-block c / 2: ql[64h .. 64h+64] and qh[32h .. 32h+32]
// hold the four units 4h + qq (ql low nibbles of bytes 0..31 for qq 0, of 32..63 for qq 1, high
// nibbles for qq 2 and 3; qh bits 2qq, 2qq+1 are the high bits).
template <>
struct Q8Dot<FmtQ6_K> {
    static constexpr int CU = 4;
    __device__ static float dot(const uint8_t* row, int c, const XQ& x) {
        const uint8_t* b = row + (size_t)(c / 2) * 210;
        const int h = c % 2;
        uint32_t lw[16], hw[8];
        ldwin<16>(b + 64 * h, lw);
        ldwin<8>(b + 128 + 32 * h, hw);
        uint32_t scw[2];
        ldwin<2>(b + 192 + 8 * h, scw);
        const float d = f16_to_f32(ld_u16(b + 208));
        float r = 0.0f;
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
            uint32_t q[8];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                q[i] = ((lw[8 * (qq & 1) + i] >> (4 * (qq >> 1))) & 0x0F0F0F0Fu) | (((hw[i] >> (2 * qq)) & 0x03030303u) << 4);
            const uint32_t sw = scw[qq / 2] >> (16 * (qq % 2));
            Scales s;
            s.d[0] = __fmul_rn(d, (float)(int8_t)(sw & 0xFFu));
            s.d[1] = __fmul_rn(d, (float)(int8_t)((sw >> 8) & 0xFFu));
            s.c[0] = s.c[1] = 0.0f;
            r += q8_unit<32, false>(q, s, x, 4 * c + qq);
        }
        return r;
    }
};

// Slots as matvec.cuh (the segment table; p1 W2, p2 x, p4 ids, p5 scales, p3 and p7 the shared
// expert (SHARED); n1 n_in, n2 row_bytes, n3 expert_bytes, n4 n_experts, n5 x_group, n6 nsum,
// n7 UT (chunk lanes), n8 RPT, n11 x_stride); n9 unused. Dynamic shared memory: nsum * xq_bytes(units).
template <class F, bool GLU, bool SHARED = false>
__device__ __forceinline__ void matvec_q8(const Args& a) {
    using D = Q8Dot<F>;
    constexpr int RPT_MAX = GLU ? MV_RPT_MAX_GLU : MV_RPT_MAX;
    DYNAMIC_SMEM(float4, smem4);
    uint8_t* xs = reinterpret_cast<uint8_t*>(smem4);
    __shared__ float red[MV_THREADS / 32][RPT_MAX * (GLU ? 2 : 1)];

    MV_SLOTS(a, GLU || SHARED ? 1 : MV_SEGS);  // expert products run one
    const MvShared shx = mv_shared_slots<GLU>(a, x_group * nsum);

    const int t = threadIdx.x, ut = t % UT, rg = t / UT, RG = MV_THREADS / UT;
    const int rows_per_block = RG * RPT;
    const int row0 = blk * rows_per_block;
    const int ov = blockIdx.y;
    const int units = (n_in + 31) / 32;
    const int chunks = units / D::CU;  // rows are whole blocks of these formats

    if (ids == nullptr) mv_prefetch_rows(W, GLU ? W2 : nullptr, row0, min(rows_per_block, n_out - row0), row_bytes);
    kernel_start();

    for (int j = 0; j < nsum; ++j)
        quantize_x(X + (size_t)((ov * nsum + j) / x_group) * x_stride, n_in, units, xs + (size_t)j * xq_bytes(units));
    __syncthreads();

    float acc[RPT_MAX], accu[RPT_MAX];
#pragma unroll
    for (int i = 0; i < RPT_MAX; ++i) acc[i] = accu[i] = 0.0f;

    for (int j = 0; j < nsum; ++j) {
        const int b = ov * nsum + j;
        int tok;
        const bool shared = mv_shared_entry<SHARED>(shx, b, tok);
        uint32_t e = 0;
        if (ids != nullptr && !shared) {
            e = ids[b - tok];
            if (e >= n_experts) continue;  // uniform over the block
        }
        const uint8_t* We = shared ? shx.w : W + (size_t)e * expert_bytes;
        const uint8_t* W2e = GLU ? (shared ? shx.w2 : W2 + (size_t)e * expert_bytes) : nullptr;
        const XQ xq = xq_view(xs + (size_t)j * xq_bytes(units), units);
        float sg[RPT_MAX], su[RPT_MAX];
#pragma unroll
        for (int i = 0; i < RPT_MAX; ++i) sg[i] = su[i] = 0.0f;
        for (int c = ut; c < chunks; c += UT) {
#pragma unroll
            for (int i = 0; i < RPT_MAX; ++i) {
                const int row = row0 + rg + RG * i;
                if (i < RPT && row < n_out) {
                    sg[i] += D::dot(We + (size_t)row * row_bytes, c, xq);
                    if (GLU) su[i] += D::dot(W2e + (size_t)row * row_bytes, c, xq);
                }
            }
        }
        const float s = shared ? mv_shared_scale(shx, tok) : scales != nullptr ? scales[b - tok] : 1.0f;
#pragma unroll
        for (int i = 0; i < RPT_MAX; ++i) {
            acc[i] += s * sg[i];
            if (GLU) accu[i] += s * su[i];
        }
    }

    mv_reduce_store<RPT_MAX, GLU>(acc, accu, red, UT, RPT, row0, n_out, out + (size_t)ov * out_stride);
}

// The formats with a fast kernel: X(ggml name, struct). Q4_K_M files are Q4_K + Q6_K (+ Q8_0 /
// F32 small tensors), Q8_0 files Q8_0; Q5_K for Q5_K_M. Others run the exact kernels.
#define FOR_EACH_Q8_FORMAT(X) \
    X(Q4_K, FmtQ4_K)          \
    X(Q5_K, FmtQ5_K)          \
    X(Q6_K, FmtQ6_K)          \
    X(Q8_0, FmtQ8_0)
