// attention.cu: partial NeoX RoPE, the KV-cache append, both fused with the q/gate split and the
// q/k norms, and causal GQA softmax attention (spec/MODEL.md 6.1-6.5). Positions come from a
// device tensor so that a recorded decode step (a CUDA graph) stays valid from token to token.
#include "common.cuh"

// cos and sin of the RoPE angle pos * theta^(-2i/n_rot) of pair i: angle, cos and sin in f64 and
// rounded once, as the CPU reference does.
__device__ __forceinline__ void rope_cs(uint32_t pos, int i, int n_rot, float theta, float& cf, float& sf) {
    const double freq = pow((double)theta, -2.0 * (double)i / (double)n_rot);
    double s, c;
    sincos((double)pos * freq, &s, &c);
    cf = (float)c;
    sf = (float)s;
}

// The pair (x0, x1) = dims (i, i + n_rot/2) rotated by the angle of rope_cs.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, float cf, float sf) {
    const float a = x0, b = x1;
    x0 = __fsub_rn(__fmul_rn(a, cf), __fmul_rn(b, sf));
    x1 = __fadd_rn(__fmul_rn(a, sf), __fmul_rn(b, cf));
}

// In place RoPE on the first n_rot dims of every head of x [T, n_head*D]: pair (i, i + n_rot/2)
// rotated by the angle (pos + t) * theta^(-2i/n_rot). Slots: p0 x, p1 pos (u32 [1]); n0 n_head,
// n1 D, n2 n_rot; f0 theta. Grid: (n_head, T); block 32..: thread i < n_rot/2.
KERNEL void rope_neox(const Args a) {
    kernel_start();
    float* x = reinterpret_cast<float*>(a.p[0]);
    const uint32_t pos = *reinterpret_cast<const uint32_t*>(a.p[1]);
    const int nh = (int)a.n[0], D = (int)a.n[1], n_rot = (int)a.n[2];
    const int half = n_rot / 2, t = blockIdx.y;
    float* head = x + ((size_t)t * nh + blockIdx.x) * D;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float cf, sf;
        rope_cs(pos + (uint32_t)t, i, n_rot, a.f[0], cf, sf);
        rope_rotate(head[i], head[i + half], cf, sf);
    }
}

// k_cache[pos + t] = k[t], v_cache[pos + t] = v[t]. Slots: p0 k, p1 v, p2 k_cache, p3 v_cache,
// p4 pos; n0 T*W, n1 W, n2 ctx (rows of the caches; rows past it are never written).
KERNEL void kv_store(const Args a) {
    kernel_start();
    const float* k = reinterpret_cast<const float*>(a.p[0]);
    const float* v = reinterpret_cast<const float*>(a.p[1]);
    float* kc = reinterpret_cast<float*>(a.p[2]);
    float* vc = reinterpret_cast<float*>(a.p[3]);
    const long long pos = *reinterpret_cast<const uint32_t*>(a.p[4]);
    const long long n = a.n[0], W = a.n[1], ctx = a.n[2];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long row = pos + i / W;
        if (row >= ctx) continue;
        kc[row * W + i % W] = k[i];
        vc[row * W + i % W] = v[i];
    }
}

// ---------------------------------------------------------------------------------------------
// The attention layer's preparation in one launch (Backend::attn_qk_prep): split_qgate, the
// per-head RMSNorms of q and k, NeoX RoPE on both and the KV-cache append, which were six launches.
// Block (h, t): h < H is query head h of token t: its gate half of qg copied to `gate`, its q half
// normalised and rotated into `q_normed`; h >= H is kv head h - H: k normalised and rotated into
// `k_normed` and into cache row pos + t, v copied into that row of the v cache (rows at or past
// ctx are never written, as kv_store). A thread computes both values of each pair it rotates
// straight from x, so nothing is read back after another thread wrote it. The values are those of
// the unfused kernels: the RMSNorm scale of norm.cu (the host picks the block size rms_norm
// would), the same roundings, the position read on the device.
struct QkPrepParams {
    const float* qg;       // [Tq, 2*H*D]: [q_0|gate_0|q_1|gate_1|...] per token
    const float* k;        // [Tk, Hkv*D]
    const float* v;        // [Tk, Hkv*D]
    const float* q_norm;   // [D]
    const float* k_norm;   // [D]
    float* gate;           // [Tq, H*D]
    float* q_normed;       // [Tq, H*D]
    float* k_normed;       // [Tk, Hkv*D]
    float* k_cache;        // [ctx, Hkv*D]
    float* v_cache;        // [ctx, Hkv*D]
    const uint32_t* pos;   // [1]: the position of token 0
    int tq, tk, nh, nkv, d, n_rot, ctx;
    float theta, eps;
    int pad_;
};
static_assert(sizeof(QkPrepParams) == 128, "mirrored in src/backend/cuda/ops/attention.rs");

// Grid: (H + Hkv, max(Tq, Tk)); block: a multiple of 32.
KERNEL void attn_qk_prep(const QkPrepParams p) {
    kernel_start();
    __shared__ float sh[32];
    const int D = p.d, t = blockIdx.y;
    const bool is_q = (int)blockIdx.x < p.nh;
    const int h = is_q ? (int)blockIdx.x : (int)blockIdx.x - p.nh;
    if (t >= (is_q ? p.tq : p.tk)) return;  // the whole block, before any barrier
    const size_t off = ((size_t)t * (is_q ? p.nh : p.nkv) + h) * D;  // this head in q/gate or k/v
    const float* x = is_q ? p.qg + 2 * off : p.k + off;               // q is the first half of its qg head
    const float* w = is_q ? p.q_norm : p.k_norm;
    float* y = (is_q ? p.q_normed : p.k_normed) + off;
    const long long pos0 = *p.pos, row = pos0 + t;
    float* kc = nullptr;
    if (is_q) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) p.gate[off + i] = x[D + i];
    } else if (row < p.ctx) {
        const size_t c = (size_t)row * p.nkv * D + (size_t)h * D;
        kc = p.k_cache + c;
        for (int i = threadIdx.x; i < D; i += blockDim.x) p.v_cache[c + i] = p.v[off + i];
    }
    const float s = rms_scale(x, D, p.eps, sh);
    const int half = p.n_rot / 2;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        if (i < half) {
            float y0 = __fmul_rn(__fmul_rn(x[i], s), w[i]), y1 = __fmul_rn(__fmul_rn(x[i + half], s), w[i + half]);
            float cf, sf;
            rope_cs((uint32_t)pos0 + (uint32_t)t, i, p.n_rot, p.theta, cf, sf);
            rope_rotate(y0, y1, cf, sf);
            y[i] = y0;
            y[i + half] = y1;
            if (kc != nullptr) {
                kc[i] = y0;
                kc[i + half] = y1;
            }
        } else if (i >= 2 * half) {  // past the rotated dims (half <= i < n_rot: done with i - half)
            const float y0 = __fmul_rn(__fmul_rn(x[i], s), w[i]);
            y[i] = y0;
            if (kc != nullptr) kc[i] = y0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Attention, split over the key range (flash-decoding). Block (h, t, s) takes query head h of
// token t against keys [s*chunk, min(n, (s+1)*chunk)) with n = pos + t + 1 (causal) and
// chunk = ceil(n / S); its 4 warps take every 4th key with an online softmax (running max m,
// sum l, accumulator acc), then merge. With S = 1 the block writes the output; otherwise it
// writes (m, l, acc[D]) and attn_combine merges the S partials. Lane l holds dims l + 32i.

#define ATT_MAXD 16  // D <= 512

// Slots: p0 q [T, H*D], p1 k_cache [ctx, Hkv*D], p2 v_cache, p3 out [T, H*D], p4 pos,
//        p5 partials [T, H, S, D + 2] (S > 1); n0 H, n1 Hkv, n2 D, n3 S, n4 ctx; f0 scale.
// Grid: (H, T, S); block 128.
KERNEL void __launch_bounds__(128) attn_split(const Args a) {
    kernel_start();
    __shared__ float sm[4], sl[4];
    __shared__ float sacc[4][ATT_MAXD * 32];
    const float* Q = reinterpret_cast<const float*>(a.p[0]);
    const float* Kc = reinterpret_cast<const float*>(a.p[1]);
    const float* Vc = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]);
    const long long pos = *reinterpret_cast<const uint32_t*>(a.p[4]);
    float* part = reinterpret_cast<float*>(a.p[5]);
    const int H = (int)a.n[0], Hkv = (int)a.n[1], D = (int)a.n[2], S = (int)a.n[3];
    const long long ctx = a.n[4];
    const float scale = a.f[0];
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int kvh = h / (H / Hkv);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long n = min(pos + t + 1, ctx);
    const long long chunk = (n + S - 1) / S;
    const long long k0 = s * chunk, k1 = min(n, k0 + chunk);
    const size_t kvw = (size_t)Hkv * D;

    float q[ATT_MAXD], acc[ATT_MAXD];
    const float* qh = Q + ((size_t)t * H + h) * D;
#pragma unroll
    for (int i = 0; i < ATT_MAXD; ++i) {
        const int d = lane + 32 * i;
        q[i] = d < D ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (long long key = k0 + w; key < k1; key += 4) {
        const float* kr = Kc + key * kvw + (size_t)kvh * D;
        const float* vr = Vc + key * kvw + (size_t)kvh * D;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; ++i) {
            const int d = lane + 32 * i;
            if (d < D) dot = fmaf(q[i], kr[d], dot);
        }
        const float sc = warp_sum(dot) * scale;
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
        const float p = expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; ++i) {
            const int d = lane + 32 * i;
            if (d < D) acc[i] = acc[i] * corr + p * vr[d];
        }
        m = m_new;
    }
    // Merge the 4 warps.
    if (lane == 0) {
        sm[w] = m;
        sl[w] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAXD; ++i) sacc[w][lane + 32 * i] = acc[i];
    __syncthreads();
    if (w != 0) return;
    float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float f[4], L = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[k] = sl[k] > 0.0f ? expf(sm[k] - M) : 0.0f;  // a warp without keys has l = 0, m = -inf
        L += sl[k] * f[k];
    }
    if (S == 1) {
        const float inv = 1.0f / L;
        float* o = out + ((size_t)t * H + h) * D;
        for (int d = lane; d < D; d += 32) {
            const int i = d / 32;
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) v += sacc[k][lane + 32 * i] * f[k];
            o[d] = v * inv;
        }
    } else {
        float* pp = part + (((size_t)t * H + h) * S + s) * (D + 2);
        if (lane == 0) {
            pp[0] = L > 0.0f ? M : -INFINITY;
            pp[1] = L;
        }
        for (int d = lane; d < D; d += 32) {
            const int i = d / 32;
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) v += sacc[k][lane + 32 * i] * f[k];
            pp[2 + d] = v;
        }
    }
}

// Merge the S partials of (t, h): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// Slots: p0 partials, p1 out [T, H*D]; n0 H, n1 D, n2 S. Grid: (H, T); block 128.
KERNEL void attn_combine(const Args a) {
    kernel_start();
    const float* part = reinterpret_cast<const float*>(a.p[0]);
    float* out = reinterpret_cast<float*>(a.p[1]);
    const int H = (int)a.n[0], D = (int)a.n[1], S = (int)a.n[2];
    const int h = blockIdx.x, t = blockIdx.y;
    const float* pp = part + ((size_t)t * H + h) * S * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < S; ++s) M = fmaxf(M, pp[(size_t)s * (D + 2)]);
    float L = 0.0f;
    for (int s = 0; s < S; ++s) {
        const float ls = pp[(size_t)s * (D + 2) + 1];
        if (ls > 0.0f) L += ls * expf(pp[(size_t)s * (D + 2)] - M);
    }
    const float inv = 1.0f / L;
    float* o = out + ((size_t)t * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < S; ++s) {
            const float ls = pp[(size_t)s * (D + 2) + 1];
            if (ls > 0.0f) v += pp[(size_t)s * (D + 2) + 2 + d] * expf(pp[(size_t)s * (D + 2)] - M);
        }
        o[d] = v * inv;
    }
}
