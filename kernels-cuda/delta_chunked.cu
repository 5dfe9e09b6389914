// delta_chunked.cu: the gated delta rule over a prompt with the chunked algorithm
// (spec/DELTANET.md B, chunk C = 64, dk = dv = 128), on the tensor cores.
//
// Contract (src/backend/mod.rs `delta_rule_chunked`): q, k, v read from the conv output
// u [T, conv_dim] = [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)] (q, k L2-normalised, q scaled);
// g, beta [T, Hv]; state M [Hv, dv, dk] value-major (row c = value index, contiguous over keys),
// updated in place; out [T, Hv*dv]. Value head j uses key head j % Hk.
//
// Two kernels:
//   pf_gdn_prep_*  grid (chunks, Hv), 256 threads: everything of B.1-B.2 that does not depend on
//                  the state: gamma = cumsum(g), A = beta (K K^T) Dec (strict lower),
//                  P = (Q K^T) Dec (lower incl. diagonal), the forward substitution
//                  (I + A) [U | W] = [beta V | beta e^gamma K]. Writes U, W, P, gamma to scratch.
//   pf_gdn_state_* grid (dv / 32, Hv), 128 threads: one pass over the chunks of a head for 32
//                  value rows of M (rows of M evolve independently, DELTANET.md A.2):
//                  Vn = U - W M^T, O = (Q e^gamma) M^T + P Vn, M = e^gamma_last M + Vn^T (K e^(gamma_last - gamma)).
//                  The slab of M lives in mma accumulators (fp32) for the whole prompt.
// Products run on m16n8k8 tf32 mma.sync. The `_exact` kernels split every operand into two tf32
// parts and add hi*hi + hi*lo + lo*hi ("3xTF32"), which keeps f32-level accuracy (the strict
// tier, chunked == recurrent at ~1e-5); the `_fast` kernels use one tf32 product (~1e-3).
// The forward substitution and all decay factors are plain fp32. exp is only ever taken of
// gamma_r - gamma_s with s <= r (never factored, DELTANET.md C).
//
// gamma is carried as hi + lo (two f32, the cumsum itself in f64). In one f32 the cumsum over a
// chunk of strong decays (|gamma| ~ 1000 for g ~ -16 per token) has an absolute rounding error of
// ~ulp(1000) = 6e-5, and every decay factor e^(gamma_r - gamma_s) inherits it as a relative error,
// also between neighbouring positions whose own difference is small: the two-call case of the GPU
// harness (T = 200, gates x20) reached state rel L2 3.3e-5. With hi + lo the differences are exact
// to f32 rounding of the difference itself, and e^gamma = e^hi (1 + lo) to a few ulp.
//
// Scratch per (head, chunk): U [64][128], W [64][128], P [64][64], gamma [2][64] (hi, lo; f32), at
// index (head * n_chunks + chunk). Rows past T are padding: q = k = v = 0, g = 0, beta = 0.
#include "pf_common.cuh"

namespace pf {

inline constexpr int GDN_C = 64, GDN_D = 128;

struct GdnParams {
    const float* u;      // [T, conv_dim]
    const float* g;      // [T, Hv]
    const float* beta;   // [T, Hv]
    float* state;        // [Hv, dv, dk]
    float* out;          // [T, Hv*dv]
    float* su;           // scratch U
    float* sw;           // scratch W
    float* sp;           // scratch P
    float* sg;           // scratch gamma: hi [64] then lo [64] per (head, chunk)
    int T, hk, hv;
};
static_assert(sizeof(GdnParams) == 88, "mirrored in src/backend/cuda/ops/delta.rs");

// c += a b with tf32 operands given as f32 values: 3xTF32 when SPLIT, else one tf32 product.
template <bool SPLIT>
struct Tf32 {
    uint32_t hi[4], lo[4];
    template <int N>
    __device__ __forceinline__ void set(const float (&x)[N]) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            if (SPLIT) {
                split_tf32(x[i], hi[i], lo[i]);
            } else {
                hi[i] = to_tf32(x[i]);
            }
        }
    }
};
// Fragments of f32 tiles in shared memory (layouts in pf_common.cuh), with optional per-row
// (A) or per-k (B) scale factors; g = lane / 4, t = lane % 4.
// A (16 x 8) at rows r0.., columns k0.. of a row-major tile with row stride ld; rows r0 + g scaled
// by s0, rows r0 + g + 8 by s1.
template <bool SPLIT>
static __device__ __forceinline__ Tf32<SPLIT> frag_a(const float* m, int ld, int r0, int k0, float s0 = 1.f,
                                                      float s1 = 1.f) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float v[4] = {m[(r0 + g) * ld + k0 + t] * s0, m[(r0 + g + 8) * ld + k0 + t] * s1,
                        m[(r0 + g) * ld + k0 + t + 4] * s0, m[(r0 + g + 8) * ld + k0 + t + 4] * s1};
    Tf32<SPLIT> f;
    f.set(v);
    return f;
}
// A^T: A (16 x 8) at rows r0.., k0.. read from a k-major tile m[k * ld + row].
template <bool SPLIT>
static __device__ __forceinline__ Tf32<SPLIT> frag_a_t(const float* m, int ld, int r0, int k0) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float v[4] = {m[(k0 + t) * ld + r0 + g], m[(k0 + t) * ld + r0 + g + 8], m[(k0 + t + 4) * ld + r0 + g],
                        m[(k0 + t + 4) * ld + r0 + g + 8]};
    Tf32<SPLIT> f;
    f.set(v);
    return f;
}
// B (8 x 8) at k0.., n0.. from an n-major tile m[n * ld + k].
template <bool SPLIT>
static __device__ __forceinline__ Tf32<SPLIT> frag_b_nk(const float* m, int ld, int n0, int k0) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float v[2] = {m[(n0 + g) * ld + k0 + t], m[(n0 + g) * ld + k0 + t + 4]};
    Tf32<SPLIT> f;
    f.set(v);
    return f;
}
// B (8 x 8) at k0.., n0.. from a k-major tile m[k * ld + n]; k0 + t scaled by s0, k0 + t + 4 by s1.
template <bool SPLIT>
static __device__ __forceinline__ Tf32<SPLIT> frag_b_kn(const float* m, int ld, int k0, int n0, float s0 = 1.f,
                                                         float s1 = 1.f) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float v[2] = {m[(k0 + t) * ld + n0 + g] * s0, m[(k0 + t + 4) * ld + n0 + g] * s1};
    Tf32<SPLIT> f;
    f.set(v);
    return f;
}

// e^(a - b) and e^a for gamma values held as hi + lo (see the file comment).
static __device__ __forceinline__ float exp_diff(float ahi, float alo, float bhi, float blo) {
    return expf((ahi - bhi) + (alo - blo));
}
static __device__ __forceinline__ float exp_hl(float hi, float lo) { return expf(hi) * (1.0f + lo); }

template <bool SPLIT>
static __device__ __forceinline__ void mma3(float* c, const Tf32<SPLIT>& a, const Tf32<SPLIT>& b) {
    if (SPLIT) {
        mma_tf32(c, a.lo, b.hi);
        mma_tf32(c, a.hi, b.lo);
    }
    mma_tf32(c, a.hi, b.hi);
}

// ---------------------------------------------------------------- kernel 1: per chunk
inline constexpr int GP_NTH = 256;
inline constexpr int GP_LD = GDN_D + 4;   // Q/K rows: a[(g) * LD + t] hits bank 4g + t
inline constexpr int GP_ALD = GDN_C + 4;  // A^T rows
inline constexpr int GP_SMEM = (2 * GDN_C * GP_LD + GDN_C * GP_ALD + 4 * GDN_C) * 4;

template <bool SPLIT>
static __device__ __forceinline__ void gdn_prep_body(const GdnParams& p) {
    PF_DYN_SMEM(smem_raw);
    float* const ks = reinterpret_cast<float*>(smem_raw);  // [64][GP_LD]
    float* const qs = ks + GDN_C * GP_LD;                  // [64][GP_LD]
    float* const at = qs + GDN_C * GP_LD;                  // A^T [64][GP_ALD]: at[s][r] = A[r][s]
    float* const gam = at + GDN_C * GP_ALD;                // gamma hi [64], lo [64]
    float* const gaml = gam + GDN_C;
    float* const bet = gaml + GDN_C;                       // beta [64]
    float* const gl = bet + GDN_C;                         // g [64]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = blockIdx.x, j = blockIdx.y, nchunks = gridDim.x;
    const int kh = j % p.hk;
    const int key_dim = p.hk * GDN_D, conv_dim = 2 * key_dim + p.hv * GDN_D;
    const int t0 = chunk * GDN_C;

    // Q and K rows of key head kh (16-byte copies, zero past T).
    for (int idx = tid; idx < 2 * GDN_C * (GDN_D / 4); idx += GP_NTH) {
        const int which = idx / (GDN_C * GDN_D / 4), rem = idx - which * (GDN_C * GDN_D / 4);
        const int r = rem / (GDN_D / 4), c4 = rem - r * (GDN_D / 4), t = t0 + r;
        const bool ok = t < p.T;
        const float* src = ok ? p.u + static_cast<long long>(t) * conv_dim + (which ? key_dim : 0) + kh * GDN_D + c4 * 4
                              : p.u;
        cp_async16((which ? ks : qs) + r * GP_LD + c4 * 4, src, ok ? 16 : 0);
    }
    cp_async_commit();
    if (tid < GDN_C) {
        const int t = t0 + tid;
        gl[tid] = t < p.T ? p.g[static_cast<long long>(t) * p.hv + j] : 0.f;
        bet[tid] = t < p.T ? p.beta[static_cast<long long>(t) * p.hv + j] : 0.f;
    }
    __syncthreads();
    if (warp == 0) {
        // Inclusive cumsum of g in f64 (exact for 64 f32 terms of similar size): lane l owns
        // positions 2l, 2l+1; stored as hi + lo.
        const double a = gl[2 * lane], b = gl[2 * lane + 1];
        double s = a + b;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double n = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += n;
        }
        const double excl = s - (a + b);
        const double v0 = excl + a, v1 = s;
        gam[2 * lane] = static_cast<float>(v0);
        gam[2 * lane + 1] = static_cast<float>(v1);
        gaml[2 * lane] = static_cast<float>(v0 - static_cast<double>(static_cast<float>(v0)));
        gaml[2 * lane + 1] = static_cast<float>(v1 - static_cast<double>(static_cast<float>(v1)));
    }
    cp_async_wait<0>();
    __syncthreads();

    // Warps 0-3: K K^T rows 16w..16w+15; warps 4-7: Q K^T rows 16(w-4)... Only the column tiles
    // s < 16 (w' + 1) (lower triangle incl. diagonal) are computed.
    const int g = lane >> 2, t4 = lane & 3;
    const int wr = warp & 3;
    const bool is_p = warp >= 4;
    const float* xa = is_p ? qs : ks;
    const int r0 = wr * 16;
    const int ntiles = 2 * wr + 2;
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < GDN_D / 8; kk++) {
        const int k0 = kk * 8;
        const Tf32<SPLIT> a = frag_a<SPLIT>(xa, GP_LD, r0, k0);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            if (nt < ntiles) mma3<SPLIT>(acc[nt], a, frag_b_nk<SPLIT>(ks, GP_LD, nt * 8, k0));
    }
    // Decay, beta, masks. Entries above the computed tiles are zero.
    float* const prow = p.sp + (static_cast<long long>(j) * nchunks + chunk) * GDN_C * GDN_C;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + g + 8 * (e >> 1), s = nt * 8 + 2 * t4 + (e & 1);
            float v = 0.f;
            if (nt < ntiles && s <= r) {
                const float dec = exp_diff(gam[r], gaml[r], gam[s], gaml[s]);  // gamma non-increasing: <= 1
                v = is_p ? acc[nt][e] * dec : (s < r ? bet[r] * acc[nt][e] * dec : 0.f);
            }
            if (is_p) {
                prow[r * GDN_C + s] = v;
            } else {
                at[s * GP_ALD + r] = v;
            }
        }
    __syncthreads();

    // Forward substitution, one right-hand-side column per thread: columns 0..127 are beta V
    // (-> U), 128..255 beta e^gamma K (-> W). Right-looking, so the inner updates are independent.
    const int col = tid;
    float x[GDN_C];
    if (col < GDN_D) {
        const float* vsrc = p.u + 2 * key_dim + j * GDN_D + col;
#pragma unroll
        for (int r = 0; r < GDN_C; r++)
            x[r] = (t0 + r < p.T) ? bet[r] * vsrc[static_cast<long long>(t0 + r) * conv_dim] : 0.f;
    } else {
#pragma unroll
        for (int r = 0; r < GDN_C; r++) x[r] = bet[r] * exp_hl(gam[r], gaml[r]) * ks[r * GP_LD + col - GDN_D];
    }
#pragma unroll
    for (int s = 0; s < GDN_C - 1; s++) {
        const float xs = x[s];
        const float4* arow = reinterpret_cast<const float4*>(at + s * GP_ALD);
#pragma unroll
        for (int r4 = (s + 1) / 4; r4 < GDN_C / 4; r4++) {
            const float4 a4 = arow[r4];
            const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 4 * r4 + e;
                if (r > s) x[r] = fmaf(-av[e], xs, x[r]);
            }
        }
    }
    pdl_trigger();  // only the stores are left: let the next kernel be scheduled (gemm_q.cu says why)
    const long long base = (static_cast<long long>(j) * nchunks + chunk) * GDN_C * GDN_D;
    float* const dst = (col < GDN_D ? p.su + col : p.sw + col - GDN_D) + base;
#pragma unroll
    for (int r = 0; r < GDN_C; r++) dst[r * GDN_D] = x[r];
    if (tid < 2 * GDN_C) p.sg[(static_cast<long long>(j) * nchunks + chunk) * 2 * GDN_C + tid] = gam[tid];
}

// ---------------------------------------------------------------- kernel 2: the state pass
inline constexpr int GS_NTH = 128, GS_ROWS = 32;
inline constexpr int GS_MLD = GDN_D + 4;   // M slab [32][132]: B operand (n = row, k = key)
inline constexpr int GS_WLD = GDN_D + 4;   // W, Q [64][132]: A operand (m = position, k = key)
inline constexpr int GS_KLD = GDN_D + 8;   // K [64][136]: B operand (k = position, n = key)
inline constexpr int GS_PLD = GDN_C + 4;   // P [64][68]: A operand
inline constexpr int GS_VLD = GS_ROWS + 8; // U, Vn [64][40]: C layout / B operand (k = position) / A^T
inline constexpr int GS_SMEM =
    (GS_ROWS * GS_MLD + 2 * GDN_C * GS_WLD + GDN_C * GS_KLD + GDN_C * GS_PLD + 2 * GDN_C * GS_VLD + 4 * GDN_C) * 4;
static_assert(GP_SMEM == 86016 && GS_SMEM == 158208, "shared memory sizes are mirrored in src/backend/cuda/ops/delta.rs");

template <bool SPLIT>
static __device__ __forceinline__ void gdn_state_body(const GdnParams& p) {
    PF_DYN_SMEM(smem_raw);
    float* const ms = reinterpret_cast<float*>(smem_raw);
    float* const ws = ms + GS_ROWS * GS_MLD;
    float* const qs = ws + GDN_C * GS_WLD;
    float* const ks = qs + GDN_C * GS_WLD;
    float* const ps = ks + GDN_C * GS_KLD;
    float* const us = ps + GDN_C * GS_PLD;
    float* const vn = us + GDN_C * GS_VLD;
    float* const gb = vn + GDN_C * GS_VLD;  // gamma hi, lo: two buffers by chunk parity

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int slab = blockIdx.x, j = blockIdx.y;
    const int c0 = slab * GS_ROWS;  // first value row of the slab
    const int kh = j % p.hk;
    const int key_dim = p.hk * GDN_D, conv_dim = 2 * key_dim + p.hv * GDN_D;
    const int nchunks = (p.T + GDN_C - 1) / GDN_C;

    auto issue_wuqg = [&](int c) {
        const long long hc = static_cast<long long>(j) * nchunks + c;
        const float* wsrc = p.sw + hc * GDN_C * GDN_D;
        const float* usrc = p.su + hc * GDN_C * GDN_D + c0;
        for (int idx = tid; idx < GDN_C * GDN_D / 4; idx += GS_NTH) {
            const int r = idx >> 5, c4 = idx & 31, t = c * GDN_C + r;
            cp_async16(ws + r * GS_WLD + c4 * 4, wsrc + r * GDN_D + c4 * 4, 16);
            const bool ok = t < p.T;
            cp_async16(qs + r * GS_WLD + c4 * 4,
                       ok ? p.u + static_cast<long long>(t) * conv_dim + kh * GDN_D + c4 * 4 : p.u, ok ? 16 : 0);
        }
        for (int idx = tid; idx < GDN_C * GS_ROWS / 4; idx += GS_NTH) {
            const int r = idx >> 3, c4 = idx & 7;
            cp_async16(us + r * GS_VLD + c4 * 4, usrc + r * GDN_D + c4 * 4, 16);
        }
        if (tid < 2 * GDN_C / 4)
            cp_async16(gb + (c & 1) * 2 * GDN_C + tid * 4, p.sg + hc * 2 * GDN_C + tid * 4, 16);
    };
    auto issue_pk = [&](int c) {
        const long long hc = static_cast<long long>(j) * nchunks + c;
        const float* psrc = p.sp + hc * GDN_C * GDN_C;
        for (int idx = tid; idx < GDN_C * GDN_C / 4; idx += GS_NTH) {
            const int r = idx >> 4, c4 = idx & 15;
            cp_async16(ps + r * GS_PLD + c4 * 4, psrc + r * GDN_C + c4 * 4, 16);
        }
        for (int idx = tid; idx < GDN_C * GDN_D / 4; idx += GS_NTH) {
            const int r = idx >> 5, c4 = idx & 31, t = c * GDN_C + r;
            const bool ok = t < p.T;
            cp_async16(ks + r * GS_KLD + c4 * 4,
                       ok ? p.u + static_cast<long long>(t) * conv_dim + key_dim + kh * GDN_D + c4 * 4 : p.u,
                       ok ? 16 : 0);
        }
    };

    // This warp's part of the state, as mma accumulators: rows 16 mt + g (+8), keys
    // 32 warp + 8 nt + 2 t4 (+1). each_pair(f) visits every (row, key) pair with its two values.
    float m[2][4][4];
    float* const st = p.state + (static_cast<long long>(j) * GDN_D + c0) * GDN_D;
    auto each_pair = [&](auto&& f) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    f(mt * 16 + g + 8 * h, warp * 32 + nt * 8 + 2 * t4, m[mt][nt][2 * h], m[mt][nt][2 * h + 1]);
    };
    each_pair([&](int row, int key, float& v0, float& v1) {
        const float2 v = *reinterpret_cast<const float2*>(st + row * GDN_D + key);
        v0 = v.x;
        v1 = v.y;
        *reinterpret_cast<float2*>(ms + row * GS_MLD + key) = v;
    });

    issue_wuqg(0);
    cp_async_commit();

    const int r0 = warp * 16;  // this warp's chunk positions in phases A and B
    for (int c = 0; c < nchunks; c++) {
        cp_async_wait<0>();
        __syncthreads();  // W/U/Q/gamma of chunk c landed; chunk c-1 phases B, C done everywhere
        issue_pk(c);
        cp_async_commit();
        const float* gam = gb + (c & 1) * 2 * GDN_C;
        const float* gaml = gam + GDN_C;

        // Phase A: Vn = U - W M^T and O = (Q e^gamma) M^T for positions r0..r0+15.
        float av[4][4], ao[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) av[nt][e] = ao[nt][e] = 0.f;
        const float eg0 = exp_hl(gam[r0 + g], gaml[r0 + g]), eg1 = exp_hl(gam[r0 + g + 8], gaml[r0 + g + 8]);
#pragma unroll 4
        for (int kk = 0; kk < GDN_D / 8; kk++) {
            const int k0 = kk * 8;
            const Tf32<SPLIT> aw = frag_a<SPLIT>(ws, GS_WLD, r0, k0), aq = frag_a<SPLIT>(qs, GS_WLD, r0, k0, eg0, eg1);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const Tf32<SPLIT> b = frag_b_nk<SPLIT>(ms, GS_MLD, nt * 8, k0);
                mma3<SPLIT>(av[nt], aw, b);
                mma3<SPLIT>(ao[nt], aq, b);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int off = (r0 + g + 8 * h) * GS_VLD + nt * 8 + 2 * t4;
                const float2 u = *reinterpret_cast<const float2*>(us + off);
                *reinterpret_cast<float2*>(vn + off) = make_float2(u.x - av[nt][2 * h], u.y - av[nt][2 * h + 1]);
            }

        cp_async_wait<0>();
        __syncthreads();  // P, K of chunk c landed; Vn complete; W, Q, U, M slab reads done
        if (c + 1 < nchunks) issue_wuqg(c + 1);
        cp_async_commit();

        // Phase B: O += P Vn over positions s <= r0 + 15 (P is lower triangular), then store.
        for (int kk = 0; kk < 2 * warp + 2; kk++) {
            const int k0 = kk * 8;
            const Tf32<SPLIT> a = frag_a<SPLIT>(ps, GS_PLD, r0, k0);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) mma3<SPLIT>(ao[nt], a, frag_b_kn<SPLIT>(vn, GS_VLD, k0, nt * 8));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int t = c * GDN_C + r0 + g + 8 * h;
            if (t < p.T) {
                float* orow = p.out + static_cast<long long>(t) * (p.hv * GDN_D) + j * GDN_D + c0 + 2 * t4;
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    *reinterpret_cast<float2*>(orow + nt * 8) = make_float2(ao[nt][2 * h], ao[nt][2 * h + 1]);
            }
        }

        // Phase C: M = e^gamma_last M + Vn^T (K e^(gamma_last - gamma)), keys 32 warp .. +31.
        const float gl = gam[GDN_C - 1], gll = gaml[GDN_C - 1];
        const float dl = exp_hl(gl, gll);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) m[mt][nt][e] *= dl;
#pragma unroll 2
        for (int kk = 0; kk < GDN_C / 8; kk++) {
            const int k0 = kk * 8;
            const float d0 = exp_diff(gl, gll, gam[k0 + t4], gaml[k0 + t4]);
            const float d1 = exp_diff(gl, gll, gam[k0 + t4 + 4], gaml[k0 + t4 + 4]);
            const Tf32<SPLIT> a[2] = {frag_a_t<SPLIT>(vn, GS_VLD, 0, k0), frag_a_t<SPLIT>(vn, GS_VLD, 16, k0)};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const Tf32<SPLIT> b = frag_b_kn<SPLIT>(ks, GS_KLD, k0, warp * 32 + nt * 8, d0, d1);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) mma3<SPLIT>(m[mt][nt], a[mt], b);
            }
        }
        // New slab for the next chunk's phase A (every warp passed this chunk's phase A above).
        each_pair([&](int row, int key, float& v0, float& v1) {
            *reinterpret_cast<float2*>(ms + row * GS_MLD + key) = make_float2(v0, v1);
        });
    }
    cp_async_wait<0>();
    pdl_trigger();  // only the state store is left
    each_pair([&](int row, int key, float& v0, float& v1) {
        *reinterpret_cast<float2*>(st + row * GDN_D + key) = make_float2(v0, v1);
    });
}

}  // namespace pf

// grid (ceil(T / 64), Hv), 256 threads, pf::GP_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(pf::GP_NTH, 1) pf_gdn_prep_exact(pf::GdnParams p) {
    pf::pdl_wait();
    pf::gdn_prep_body<true>(p);
}
// The `_fast` (one tf32 pass) kernels are timed by dev/cuda/prefill_bench.cu; the backend runs
// `_exact` (3xTF32) at both precisions (src/backend/cuda/ops/delta.rs says why).
extern "C" __global__ void __launch_bounds__(pf::GP_NTH, 1) pf_gdn_prep_fast(pf::GdnParams p) {
    pf::pdl_wait();
    pf::gdn_prep_body<false>(p);
}
// grid (dv / 32, Hv), 128 threads, pf::GS_SMEM bytes; after pf_gdn_prep_* on the same stream.
extern "C" __global__ void __launch_bounds__(pf::GS_NTH, 1) pf_gdn_state_exact(pf::GdnParams p) {
    pf::pdl_wait();
    pf::gdn_state_body<true>(p);
}
extern "C" __global__ void __launch_bounds__(pf::GS_NTH, 1) pf_gdn_state_fast(pf::GdnParams p) {
    pf::pdl_wait();
    pf::gdn_state_body<false>(p);
}
