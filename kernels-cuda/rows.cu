// rows.cu: the ops of a step whose rows belong to different sequences (src/backend/rows.rs,
// DESIGN.md "Many sequences in one step"), one launch each for all B rows: conv1d + SiLU, the
// recurrent delta rule, NeoX RoPE, the KV-cache append and attention. Row b's sequence slot and
// position are read on the device from `rows` (u32 [B, 2] of (slot, pos)), never passed by the
// host: a recorded step (a CUDA graph) stays valid when the rows change, and grids depend only on
// B and the pool's shapes. The arithmetic of each row is that of the one-sequence kernel it
// follows (conv.cu, delta_rule.cu, attention.cu), so a row equals its sequence run alone.
#include "common.cuh"
#include "delta_token.cuh"

// Row b's slot and position.
__device__ __forceinline__ uint32_t row_slot(const uint32_t* rows, int b) { return rows[2 * b]; }
__device__ __forceinline__ uint32_t row_pos(const uint32_t* rows, int b) { return rows[2 * b + 1]; }

// ---------------------------------------------------------------------------------------------
// Causal conv1d + SiLU of one token per row (conv.cu conv1d_silu with T = 1): X = [state of the
// row's slot (K-1 rows) | x[b]]; out[b][c] = silu(sum_j w[c][j] X[j][c]) in tap order, then the
// slot's state shifts up by one row with x[b] last. A thread owns one channel of one row.
// Slots: p0 x [B, C], p1 w [C, K], p2 states [S*(K-1), C], p3 out [B, C], p4 rows; n0 C, n1 K.
// Grid: (ceil(C / 256), B); block 256.
KERNEL void rows_conv1d_silu(const Args a) {
    kernel_start();
    const float* x = reinterpret_cast<const float*>(a.p[0]);
    const float* w = reinterpret_cast<const float*>(a.p[1]);
    float* states = reinterpret_cast<float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[4]);
    const int C = (int)a.n[0], K = (int)a.n[1], b = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float* st = states + (size_t)row_slot(rows, b) * (K - 1) * C;
    const float xc = x[(size_t)b * C + c];
    float y = 0.0f;
    for (int j = 0; j < K - 1; ++j) y = __fadd_rn(y, __fmul_rn(w[(size_t)c * K + j], st[(size_t)j * C + c]));
    y = __fadd_rn(y, __fmul_rn(w[(size_t)c * K + K - 1], xc));
    out[(size_t)b * C + c] = siluf_(y);
    // In increasing row order: row r takes row r + 1, which nothing has overwritten yet.
    for (int r = 0; r < K - 2; ++r) st[(size_t)r * C + c] = st[(size_t)(r + 1) * C + c];
    st[(size_t)(K - 2) * C + c] = xc;
}

// ---------------------------------------------------------------------------------------------
// The recurrent delta rule of one token per row (delta_rule.cu with T = 1) on the row's slot of
// the state pool: value head j of slot s is rows (s*Hv + j)*dv .. of states [S*Hv*dv, dk]. One
// warp owns one state row; lane l holds columns l + 32m; the row is read and written once,
// coalesced (dk contiguous floats per warp).
// Slots: p0 u [B, conv_dim], p1 g [B, Hv], p2 beta [B, Hv], p3 states, p4 out [B, Hv*dv],
// p5 rows; n1 hk, n2 hv, n3 dk, n4 dv. Grid: (Hv, ceil(dv / 4), B); block 128 (4 rows).
template <int DR_MAXC>
__device__ __forceinline__ void rows_delta_rule(const Args& a) {
    kernel_start();
    const float* u = reinterpret_cast<const float*>(a.p[0]);
    const float* g = reinterpret_cast<const float*>(a.p[1]);
    const float* beta = reinterpret_cast<const float*>(a.p[2]);
    float* states = reinterpret_cast<float*>(a.p[3]);
    float* out = reinterpret_cast<float*>(a.p[4]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[5]);
    const int hk = (int)a.n[1], hv = (int)a.n[2], dk = (int)a.n[3], dv = (int)a.n[4];
    const int j = blockIdx.x, b = blockIdx.z;
    const int c = blockIdx.y * 4 + (int)threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (c >= dv) return;  // whole warps only: no block barrier below
    const int kh = j % hk;  // tiled GGUF order: value head j uses key head j mod hk
    const int kd = hk * dk, cd = 2 * kd + hv * dv;
    float* row = states + (((size_t)row_slot(rows, b) * hv + j) * dv + c) * dk;
    const float* ub = u + (size_t)b * cd;
    const float* q = ub + kh * dk;
    const float* k = ub + kd + kh * dk;
    const float v = ub[2 * kd + j * dv + c];
    const float decay = expf(g[(size_t)b * hv + j]);
    const float bt = beta[(size_t)b * hv + j];

    float M[DR_MAXC];
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        const int i = lane + 32 * m;
        M[m] = i < dk ? row[i] : 0.0f;
    }
    const float o = delta_token<DR_MAXC>(M, q, k, v, decay, bt, dk, lane);
    if (lane == 0) out[(size_t)b * hv * dv + (size_t)j * dv + c] = o;
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        const int i = lane + 32 * m;
        if (i < dk) row[i] = M[m];
    }
}

// One instantiation per register budget, as delta_rule.cu: dk <= 128 (Qwen3.5), 256, 512.
KERNEL void __launch_bounds__(128) rows_delta_rule_4(const Args a) { rows_delta_rule<4>(a); }
KERNEL void __launch_bounds__(128) rows_delta_rule_8(const Args a) { rows_delta_rule<8>(a); }
KERNEL void __launch_bounds__(128) rows_delta_rule_16(const Args a) { rows_delta_rule<16>(a); }

// ---------------------------------------------------------------------------------------------
// In place NeoX RoPE of every head of row b at the row's position (attention.cu rope_neox).
// Slots: p0 x [B, n_head*D], p1 rows; n0 n_head, n1 D, n2 n_rot; f0 theta.
// Grid: (n_head, B); block 32..256: thread i < n_rot/2.
__device__ __forceinline__ void rope_cs_rows(uint32_t pos, int i, int n_rot, float theta, float& cf, float& sf) {
    // attention.cu rope_cs: the angle in f64, rounded once, as the CPU reference.
    const double freq = pow((double)theta, -2.0 * (double)i / (double)n_rot);
    double s, c;
    sincos((double)pos * freq, &s, &c);
    cf = (float)c;
    sf = (float)s;
}

KERNEL void rows_rope_neox(const Args a) {
    kernel_start();
    float* x = reinterpret_cast<float*>(a.p[0]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[1]);
    const int nh = (int)a.n[0], D = (int)a.n[1], n_rot = (int)a.n[2];
    const int half = n_rot / 2, b = blockIdx.y;
    const uint32_t pos = row_pos(rows, b);
    float* head = x + ((size_t)b * nh + blockIdx.x) * D;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float cf, sf;
        rope_cs_rows(pos, i, n_rot, a.f[0], cf, sf);
        const float x0 = head[i], x1 = head[i + half];
        head[i] = __fsub_rn(__fmul_rn(x0, cf), __fmul_rn(x1, sf));
        head[i + half] = __fadd_rn(__fmul_rn(x0, sf), __fmul_rn(x1, cf));
    }
}

// ---------------------------------------------------------------------------------------------
// k_pool[slot*ctx + pos] = k[b], the same for v (pools [S*ctx, W]).
// Slots: p0 k [B, W], p1 v, p2 k_pool, p3 v_pool, p4 rows; n0 W, n1 ctx.
// Grid: (ceil(W / 256), B); block 256.
KERNEL void rows_kv_store(const Args a) {
    kernel_start();
    const float* k = reinterpret_cast<const float*>(a.p[0]);
    const float* v = reinterpret_cast<const float*>(a.p[1]);
    float* kp = reinterpret_cast<float*>(a.p[2]);
    float* vp = reinterpret_cast<float*>(a.p[3]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[4]);
    const long long W = a.n[0], ctx = a.n[1];
    const int b = blockIdx.y;
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long pos = row_pos(rows, b);
    if (i >= W || pos >= ctx) return;  // the host checked pos < ctx; a bad row never writes past its slot
    const long long dst = ((long long)row_slot(rows, b) * ctx + pos) * W + i;
    kp[dst] = k[b * W + i];
    vp[dst] = v[b * W + i];
}

// ---------------------------------------------------------------------------------------------
// Attention of each row's query against rows 0..pos of its slot (flash-decoding, as attention.cu
// attn_split). Rows differ in length, so the key range is cut into splits of a fixed `chunk`
// keys (chunk = ceil(ctx / S), from the pool's context, not from any row): block (g, b, s) takes
// keys [s*chunk, min(n, (s+1)*chunk)) of row b, n = pos + 1, and exits at once when that is empty
// (the row is shorter); the combine pass merges the splits a row has. A block takes HB query
// heads that share one KV head (GQA), so each K and V row it loads serves HB queries. Its 4
// warps take every 4th key with an online softmax per head (running max m, sum l, accumulator
// acc), then merge; lane l holds dims l + 32i.
// Slots: p0 q [B, H*D], p1 k_pool [S*ctx, Hkv*D], p2 v_pool, p3 out [B, H*D], p4 rows,
//        p5 partials [B, H, S, D + 2] (S > 1); n0 H, n1 Hkv, n2 D, n3 S, n4 ctx, n5 chunk;
//        f0 scale. Grid: (H / HB, B, S); block 128.
template <int HB, int DL>
__device__ __forceinline__ void rows_attn(const Args& a) {
    kernel_start();
    __shared__ float sm[4][HB], sl[4][HB];
    __shared__ float sacc[4][HB][DL * 32];
    const float* Q = reinterpret_cast<const float*>(a.p[0]);
    const float* Kp = reinterpret_cast<const float*>(a.p[1]);
    const float* Vp = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[4]);
    float* part = reinterpret_cast<float*>(a.p[5]);
    const int H = (int)a.n[0], Hkv = (int)a.n[1], D = (int)a.n[2], S = (int)a.n[3];
    const long long ctx = a.n[4], chunk = a.n[5];
    const float scale = a.f[0];
    const int h0 = blockIdx.x * HB, b = blockIdx.y, s = blockIdx.z;
    const long long n = min((long long)row_pos(rows, b) + 1, ctx);
    const long long k0 = s * chunk, k1 = min(n, k0 + chunk);
    if (k0 >= k1) return;  // past the row's length: the combine pass skips this split (whole block)
    const int kvh = h0 / (H / Hkv);  // HB divides H / Hkv: every head of the block shares it
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t kvw = (size_t)Hkv * D;
    const float* kbase = Kp + (size_t)row_slot(rows, b) * ctx * kvw + (size_t)kvh * D;
    const float* vbase = Vp + (size_t)row_slot(rows, b) * ctx * kvw + (size_t)kvh * D;

    float q[HB][DL], acc[HB][DL], m[HB], l[HB];
#pragma unroll
    for (int hh = 0; hh < HB; ++hh) {
        const float* qh = Q + ((size_t)b * H + h0 + hh) * D;
#pragma unroll
        for (int i = 0; i < DL; ++i) {
            const int d = lane + 32 * i;
            q[hh][i] = d < D ? qh[d] : 0.0f;
            acc[hh][i] = 0.0f;
        }
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
    }
    for (long long key = k0 + w; key < k1; key += 4) {
        const float* kr = kbase + key * kvw;
        const float* vr = vbase + key * kvw;
        float kk[DL], vv[DL];
#pragma unroll
        for (int i = 0; i < DL; ++i) {
            const int d = lane + 32 * i;
            kk[i] = d < D ? kr[d] : 0.0f;
            vv[i] = d < D ? vr[d] : 0.0f;
        }
#pragma unroll
        for (int hh = 0; hh < HB; ++hh) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < DL; ++i) dot = fmaf(q[hh][i], kk[i], dot);
            const float sc = warp_sum(dot) * scale;
            const float m_new = fmaxf(m[hh], sc);
            const float corr = expf(m[hh] - m_new);  // 0 for the first key (m = -inf)
            const float p = expf(sc - m_new);
            l[hh] = l[hh] * corr + p;
#pragma unroll
            for (int i = 0; i < DL; ++i) acc[hh][i] = acc[hh][i] * corr + p * vv[i];
            m[hh] = m_new;
        }
    }
    // Merge the 4 warps, per head.
#pragma unroll
    for (int hh = 0; hh < HB; ++hh) {
        if (lane == 0) {
            sm[w][hh] = m[hh];
            sl[w][hh] = l[hh];
        }
#pragma unroll
        for (int i = 0; i < DL; ++i) sacc[w][hh][lane + 32 * i] = acc[hh][i];
    }
    __syncthreads();
    // Warp w finishes heads w, w + 4, ... of the block.
    for (int hh = w; hh < HB; hh += 4) {
        const float M = fmaxf(fmaxf(sm[0][hh], sm[1][hh]), fmaxf(sm[2][hh], sm[3][hh]));
        float f[4], L = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[k] = sl[k][hh] > 0.0f ? expf(sm[k][hh] - M) : 0.0f;  // a warp without keys: l = 0
            L += sl[k][hh] * f[k];
        }
        const int h = h0 + hh;
        if (S == 1) {
            const float inv = 1.0f / L;
            float* o = out + ((size_t)b * H + h) * D;
            for (int d = lane; d < D; d += 32) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; ++k) v += sacc[k][hh][d] * f[k];
                o[d] = v * inv;
            }
        } else {
            float* pp = part + (((size_t)b * H + h) * S + s) * (D + 2);
            if (lane == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            for (int d = lane; d < D; d += 32) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; ++k) v += sacc[k][hh][d] * f[k];
                pp[2 + d] = v;
            }
        }
    }
}

// Heads per block (HB) x dims per lane (DL = ceil(D / 32)), HB * DL <= 32 (registers).
#define ROWS_ATTN(HB, DL) \
    KERNEL void __launch_bounds__(128) rows_attn_##HB##_##DL(const Args a) { rows_attn<HB, DL>(a); }
ROWS_ATTN(1, 2)
ROWS_ATTN(1, 4)
ROWS_ATTN(1, 8)
ROWS_ATTN(1, 16)
ROWS_ATTN(2, 2)
ROWS_ATTN(2, 4)
ROWS_ATTN(2, 8)
ROWS_ATTN(2, 16)
ROWS_ATTN(4, 2)
ROWS_ATTN(4, 4)
ROWS_ATTN(4, 8)

// Merge the splits of (b, h) that hold keys (ceil(n / chunk) of them): out = sum_s acc_s
// e^(m_s - M) / sum_s l_s e^(m_s - M). Slots: p0 partials, p1 out [B, H*D], p2 rows; n0 H, n1 D,
// n2 S, n3 ctx, n4 chunk. Grid: (H, B); block 128.
KERNEL void rows_attn_combine(const Args a) {
    kernel_start();
    const float* part = reinterpret_cast<const float*>(a.p[0]);
    float* out = reinterpret_cast<float*>(a.p[1]);
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(a.p[2]);
    const int H = (int)a.n[0], D = (int)a.n[1], S = (int)a.n[2];
    const long long ctx = a.n[3], chunk = a.n[4];
    const int h = blockIdx.x, b = blockIdx.y;
    const long long n = min((long long)row_pos(rows, b) + 1, ctx);
    const int live = (int)min((long long)S, (n + chunk - 1) / chunk);
    const float* pp = part + ((size_t)b * H + h) * S * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < live; ++s) M = fmaxf(M, pp[(size_t)s * (D + 2)]);
    float L = 0.0f;
    for (int s = 0; s < live; ++s) {
        const float ls = pp[(size_t)s * (D + 2) + 1];
        if (ls > 0.0f) L += ls * expf(pp[(size_t)s * (D + 2)] - M);
    }
    const float inv = 1.0f / L;
    float* o = out + ((size_t)b * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < live; ++s) {
            const float ls = pp[(size_t)s * (D + 2) + 1];
            if (ls > 0.0f) v += pp[(size_t)s * (D + 2) + 2 + d] * expf(pp[(size_t)s * (D + 2)] - M);
        }
        o[d] = v * inv;
    }
}
