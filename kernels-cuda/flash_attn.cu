// flash_attn.cu: causal GQA softmax attention for prefill, head dim 256, on the tensor cores
// (FlashAttention-2 style: online softmax, the score tile never leaves registers).
//
// Contract (src/backend/mod.rs `attention`): T new queries at positions pos0 .. pos0+T-1 attend to
// cache rows 0 ..= their own position; query head h uses KV head h / (H / Hkv); out [T, H*D] f32.
// Inputs here: q [T, H*D] f32 (scaled and rounded to f16 on load), k and v [pos0+T, Hkv*D] f16
// (rows of the f32 cache converted by pf_f32_to_f16). Precision tier: f16-rounded q, k, v and
// probabilities, f32 scores, sums and accumulators (fixtures tier "F16-rounded activations").
//
// CTA = 64 queries of one head, 4 warps of 16 query rows; K and V tiles of 64 keys. Per KV tile:
// S = Q K^T (m16n8k16, K rows are the "col" operand as stored), causal mask on the diagonal tiles,
// online softmax in base 2 (the scale carries log2 e), O += P V with P re-packed from the score
// accumulators into A fragments and V read through ldmatrix.trans. V of tile j streams in while
// S is computed, K of tile j+1 while P V runs. Tiles are 512-byte rows of 32 16-byte chunks,
// chunk c of row r stored at c ^ (r & 7) (conflict-free ldmatrix).
#include "pf_common.cuh"

namespace pf {

inline constexpr int FA_D = 256, FA_BQ = 64, FA_BKV = 64, FA_NTH = 128;
inline constexpr int FA_ROWB = FA_D * 2;                      // bytes per f16 row
inline constexpr int FA_TILE = FA_BQ * FA_ROWB;               // 32 KB
inline constexpr int FA_SMEM = 3 * FA_TILE;                   // Q, K, V: 96 KB (two CTAs per SM)

struct FlashParams {
    const float* q;     // [T, H*D]
    const __half* k;    // [pos0+T, Hkv*D]
    const __half* v;
    float* out;         // [T, H*D]
    int T, pos0, n_head, n_head_kv;
    float scale_log2;   // softmax scale * log2(e)
};
static_assert(sizeof(FlashParams) == 56 && FA_SMEM == 98304, "mirrored in src/backend/cuda/ops/attention.rs");

static __device__ __forceinline__ void fa_load_kv(uint8_t* dst, const __half* src, int kv0, int kv_len, int ld,
                                                  int tid) {
    // 64 rows x 32 chunks; zero rows at and past kv_len.
#pragma unroll 4
    for (int i = 0; i < FA_BKV * 32 / FA_NTH; i++) {
        const int idx = tid + i * FA_NTH, r = idx >> 5, c = idx & 31, key = kv0 + r;
        const bool ok = key < kv_len;
        const __half* s = ok ? src + static_cast<long long>(key) * ld + c * 8 : src;
        cp_async16(dst + r * FA_ROWB + ((c ^ (r & 7)) << 4), s, ok ? 16 : 0);
    }
}

static __device__ __forceinline__ void flash_body(const FlashParams& p) {
    PF_DYN_SMEM(smem);
    uint8_t* const qs = smem;
    uint8_t* const ks = smem + FA_TILE;
    uint8_t* const vs = smem + 2 * FA_TILE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3, l7 = lane & 7;
    const int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int head = blockIdx.y;
    const int kvh = head / (p.n_head / p.n_head_kv);
    const int q0 = qt * FA_BQ;
    const int kv_len = p.pos0 + p.T;
    const int ldq = p.n_head * FA_D, ldkv = p.n_head_kv * FA_D;
    const __half* kbase = p.k + kvh * FA_D;
    const __half* vbase = p.v + kvh * FA_D;
    const int last_q = p.pos0 + min(p.T, q0 + FA_BQ) - 1;  // largest query position of the tile
    const int nblk = last_q / FA_BKV + 1;

    fa_load_kv(ks, kbase, 0, kv_len, ldkv, tid);
    cp_async_commit();

    // Q tile: f32 -> * scale log2e -> f16, rows past T zero.
#pragma unroll 4
    for (int i = 0; i < FA_BQ * (FA_D / 4) / FA_NTH; i++) {
        const int idx = tid + i * FA_NTH, r = idx >> 6, c4 = idx & 63, t = q0 + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < p.T) x = *reinterpret_cast<const float4*>(p.q + static_cast<long long>(t) * ldq + head * FA_D + c4 * 4);
        uint2 h;
        h.x = pack_half2(x.x * p.scale_log2, x.y * p.scale_log2);
        h.y = pack_half2(x.z * p.scale_log2, x.w * p.scale_log2);
        *reinterpret_cast<uint2*>(qs + r * FA_ROWB + (((c4 >> 1) ^ (r & 7)) << 4) + (c4 & 1) * 8) = h;
    }

    float o[FA_D / 8][4];
#pragma unroll
    for (int i = 0; i < FA_D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int r_lo = warp * 16 + g;                       // this thread's rows r_lo, r_lo + 8
    const int qpos[2] = {p.pos0 + q0 + r_lo, p.pos0 + q0 + r_lo + 8};
    const int arow = (warp * 16 + l7 + 8 * ((lane >> 3) & 1)) * FA_ROWB;

    for (int j = 0; j < nblk; j++) {
        const int kv0 = j * FA_BKV;
        fa_load_kv(vs, vbase, kv0, kv_len, ldkv, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // K tile j (and, for j = 0, the Q tile) visible

        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FA_D / 16; kk++) {
            uint32_t a[4], b[8][2];
            ldsm_x4(a[0], a[1], a[2], a[3], qs + arow + (((2 * kk + (lane >> 4)) ^ l7) << 4));
#pragma unroll
            for (int np = 0; np < 4; np++)
                ldsm_x4(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                        ks + (np * 16 + l7 + 8 * (lane >> 4)) * FA_ROWB + (((2 * kk + ((lane >> 3) & 1)) ^ l7) << 4));
#pragma unroll
            for (int nt = 0; nt < 8; nt++) mma_f16(s[nt], a, b[nt]);
        }

        // Causal mask (and keys past the cache end) where the tile reaches past the first query.
        if (kv0 + FA_BKV - 1 > p.pos0 + q0 || kv0 + FA_BKV > kv_len) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kv0 + nt * 8 + 2 * t4 + (e & 1);
                    if (key > qpos[e >> 1] || key >= kv_len) s[nt][e] = -INFINITY;
                }
        }

        // Online softmax. Tile 0 always holds key 0 <= every query position, so the running max
        // is finite from then on and no exp2 sees -inf - -inf.
        uint32_t pa[4][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrow[h], mx);
            const float corr = exp2f(mrow[h] - mnew);
            mrow[h] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[nt][2 * h] = exp2f(s[nt][2 * h] - mnew);
                s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - mnew);
                sum += s[nt][2 * h] + s[nt][2 * h + 1];
            }
            lrow[h] = lrow[h] * corr + sum;
#pragma unroll
            for (int dt = 0; dt < FA_D / 8; dt++) {
                o[dt][2 * h] *= corr;
                o[dt][2 * h + 1] *= corr;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            pa[kk][0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
            pa[kk][1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
            pa[kk][2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[kk][3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }

        __syncthreads();  // every warp is done with K tile j
        if (j + 1 < nblk) fa_load_kv(ks, kbase, kv0 + FA_BKV, kv_len, ldkv, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // V tile j visible

#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint8_t* vrow = vs + (kk * 16 + l7 + 8 * ((lane >> 3) & 1)) * FA_ROWB;
#pragma unroll
            for (int dp = 0; dp < FA_D / 16; dp++) {
                uint32_t b0[2], b1[2];
                ldsm_x4_t(b0[0], b0[1], b1[0], b1[1], vrow + (((2 * dp + (lane >> 4)) ^ l7) << 4));
                mma_f16(o[2 * dp], pa[kk], b0);
                mma_f16(o[2 * dp + 1], pa[kk], b1);
            }
        }
        __syncthreads();  // every warp is done with V tile j before the next one lands
    }
    cp_async_wait<0>();
    pdl_trigger();  // only the normalisation and stores are left (gemm_q.cu says why)

#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = lrow[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = 1.0f / l;
        const int t = q0 + r_lo + 8 * h;
        if (t >= p.T) continue;
        float* orow = p.out + static_cast<long long>(t) * ldq + head * FA_D + 2 * t4;
#pragma unroll
        for (int dt = 0; dt < FA_D / 8; dt++)
            *reinterpret_cast<float2*>(orow + dt * 8) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
}

}  // namespace pf

// grid (ceil(T / 64), n_head), 128 threads, pf::FA_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(pf::FA_NTH, 2) pf_flash_attn_d256(pf::FlashParams p) {
    pf::pdl_wait();
    pf::flash_body(p);
}
