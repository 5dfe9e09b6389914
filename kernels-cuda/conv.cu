// conv.cu: the causal depthwise conv1d + SiLU of the Gated DeltaNet layer (spec/MODEL.md 5.3),
// continuing from and updating the rolling state, and its fusion with the q/k L2 norm.
//
// Conceptually X = [state (K-1 rows) | x (T rows)] along time; out[t][c] = silu(sum_j w[c][j] *
// X[t+j][c]) and the new state is the last K-1 rows of X. Each channel is independent: a thread
// owns one channel for one tile of `tt` tokens (blockIdx.y picks the tile), reading X straight
// from the state and x buffers, so a long prefill spreads over C/256 x T/tt blocks instead of
// looping over T in C threads. Only tile 0 reads the old state (tt >= K-1: a later tile's rows
// t + j >= tt are all in x), and only tile 0 writes the new state, after its own reads.
#include "common.cuh"

// X[r][c] of the concatenation [state | x].
__device__ __forceinline__ float conv_in(const float* state, const float* x, int r, int c, int C, int K) {
    return r < K - 1 ? state[(size_t)r * C + c] : x[(size_t)(r - (K - 1)) * C + c];
}

// silu(sum_j w[c][j] * X[t + j][c]), summed in tap order like the CPU reference.
__device__ __forceinline__ float conv_at(const float* state, const float* x, const float* w, int t, int c, int C, int K) {
    float y = 0.0f;
    for (int j = 0; j < K; ++j) y = __fadd_rn(y, __fmul_rn(w[(size_t)c * K + j], conv_in(state, x, t + j, c, C, K)));
    return siluf_(y);
}

// Rows T .. T+K-2 of X become the state. Written in increasing row order: row r reads X[T + r],
// which is either x or a state row above r, never one already overwritten.
__device__ __forceinline__ void conv_shift_state(float* state, const float* x, int T, int c, int C, int K) {
    for (int r = 0; r < K - 1; ++r) state[(size_t)r * C + c] = conv_in(state, x, T + r, c, C, K);
}

// Slots: p0 x [T, C], p1 w [C, K], p2 state [K-1, C], p3 out [T, C]; n0 T, n1 C, n2 K,
// n5 tt (tokens per tile, >= K-1). Grid: (ceil(C / 256), ceil(T / tt)); block 256.
KERNEL void conv1d_silu(const Args a) {
    kernel_start();
    const float* x = reinterpret_cast<const float*>(a.p[0]);
    const float* w = reinterpret_cast<const float*>(a.p[1]);
    float* state = reinterpret_cast<float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]);
    const int T = (int)a.n[0], C = (int)a.n[1], K = (int)a.n[2];
    const int tt = (int)a.n[5], t0 = (int)blockIdx.y * tt, t1 = min(T, t0 + tt);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = t0; t < t1; ++t) out[(size_t)t * C + c] = conv_at(state, x, w, t, c, C, K);
    if (blockIdx.y == 0) conv_shift_state(state, x, T, c, C, K);
}

// The Gated DeltaNet's per-token preparation in one launch: conv1d_silu, then the L2 norm of every
// q and k head (dk channels each; q heads also scaled by 1/sqrt(dk)), and the delta-rule gates
// (gdn_gates) in extra blocks. Conv blocks: a block owns one head's channels (blockDim = dk rounded
// up to 32): blocks 0 .. 2hk-1 are the q and k heads, blocks 2hk .. conv_blocks-1 cover the v
// channels in slices of blockDim, which are not normalised. The per-token sum of squares of a head
// is a block reduction. With gates (n_gates > 0) the grid has one more block per tile, which
// computes that tile's share (gate_chunk elements) of the T x Hv gates: they read and write
// nothing the conv touches, and are too few (T x Hv values) to be worth a launch of their own.
struct ConvL2qkParams {
    const float* x;        // [T, C]
    const float* w;        // [C, K]
    float* state;          // [K-1, C]
    float* out;            // [T, C]
    const float* a;        // gate inputs [n_gates] (T x Hv), unused without gates
    const float* b;
    const float* ssm_a;    // [Hv]
    const float* dt_bias;  // [Hv]
    float* g;              // gate outputs [n_gates]
    float* beta;
    int T, C, K, tt;       // tokens, channels, taps, tokens per tile (>= K-1; blockIdx.y the tile)
    int hk, dk;            // key heads and their dim
    int conv_blocks;       // conv blocks per tile: 2hk + ceil(value channels / blockDim)
    int n_gates, hv, gate_chunk;  // gate elements (0: no gate blocks), value heads, elements per tile
    float eps;
    int pad_;
};
static_assert(sizeof(ConvL2qkParams) == 128, "mirrored in src/backend/cuda/ops/conv.rs");

// Grid: (conv_blocks + (n_gates > 0), ceil(T / tt)); block dk rounded up to 32.
KERNEL void conv1d_silu_l2qk(const ConvL2qkParams p) {
    kernel_start();
    __shared__ float sh[32];
    const int T = p.T, C = p.C, K = p.K, hk = p.hk, dk = p.dk;
    const int tt = p.tt, t0 = (int)blockIdx.y * tt, t1 = min(T, t0 + tt);
    const int h = blockIdx.x;
    if (h >= p.conv_blocks) {
        // The gate block of this tile (the whole block leaves: no barrier below is reached).
        const long long e0 = (long long)blockIdx.y * p.gate_chunk, e1 = min((long long)p.n_gates, e0 + p.gate_chunk);
        for (long long i = e0 + threadIdx.x; i < e1; i += blockDim.x) gdn_gate(p.a, p.b, p.ssm_a, p.dt_bias, p.g, p.beta, i, p.hv);
        return;
    }
    const bool qk = h < 2 * hk;
    // Channel of this thread: inside head h for q/k blocks, else in the v slice h - 2hk.
    const int c = qk ? h * dk + (int)threadIdx.x : 2 * hk * dk + (h - 2 * hk) * (int)blockDim.x + (int)threadIdx.x;
    const bool live = qk ? (int)threadIdx.x < dk : c < C;
    const float qscale = h < hk ? 1.0f / sqrtf((float)dk) : 1.0f;
    for (int t = t0; t < t1; ++t) {
        const float y = live ? conv_at(p.state, p.x, p.w, t, c, C, K) : 0.0f;
        float v = y;
        if (qk) {
            const float ss = block_sum(y * y, sh);  // every thread of the block takes part
            v = y * ((1.0f / sqrtf(ss + p.eps)) * qscale);
        }
        if (live) p.out[(size_t)t * C + c] = v;
    }
    if (live && blockIdx.y == 0) conv_shift_state(p.state, p.x, T, c, C, K);
}
