// gdn_step.cu: the middle of a Gated DeltaNet layer for one decode token in one launch: the
// causal conv + SiLU, the q/k L2 norm, the gates, the row-owned delta rule, the gated RMSNorm and
// its output prepared for the out projection (`Backend::gdn_recurrent_step`; launched by
// src/backend/cuda/ops/gdn_step.rs). The op's default is three launches: conv.cu's
// conv1d_silu_l2qk with the gate blocks, delta_rule.cu, norm.cu's gated norm.
//
// Why: in decode those are three short kernels in the layer's serial chain; each pays a grid
// boundary and an L2 round trip for the previous one's output (dev/cuda/DECISIONS.md, launches
// per layer). The same values, computed as follows:
//   - A block owns GS_ROWS = 16 state rows of one value head j (8 warps x 2 rows; lane l holds
//     columns l + 32m as in delta_rule.cu); grid hv * dv / 16. Its rows of the state, the conv
//     weights and conv state of its channels are loaded before the dependent-launch wait: no
//     kernel since this layer's previous token writes them.
//   - Every block computes the conv of its key head's q and k channels (thread i: channel i of
//     [q | k], 2 dk <= 256 threads) and of its 16 v channels itself: the q/k conv is repeated by
//     each of the (hv / hk) (dv / 16) blocks of a key head, ~8 KB of L2 reads each, less than a
//     launch costs. Their conv state is shared: each block counts itself in the key head's
//     counter once it has used the state's values (at its end, off the path to the delta rule),
//     and the last one writes the shifted state and resets the counter. A v channel has one
//     owner, which shifts its own.
//   - The gated norm needs a head's dv outputs, the prepared copy a slice of 256: each block
//     counts itself in its slice's counter after storing its outputs (as out_prep.cuh does); the
//     last of the slice reads the slice back from L2, normalizes and gates each head (norm.cu's
//     gated_rms_norm_slices arithmetic: common.cuh gated_norm_in_slice) and prepares it
//     (out_prep.cuh prep_slice_block, as norm.cu's slice kernels).
// Requirements (ops/gdn_step.rs `fits`): one token, K = 4 taps, dk a multiple of 32 and at most
// 128, dv a multiple of 32 that divides 256, hv * dv a multiple of 256. Counters: hk + hv dv / 256
// words, zero between launches (each user leaves them zero).
#include "common.cuh"
#if defined(__CUDACC__)
#include "out_prep.cuh"
#endif

struct GdnStepParams {
    const float* qkv;               // [C]: q | k | v projections
    const float* conv_w;            // [C, K]
    float* conv_state;              // [K-1, C]
    const float* a;                 // [hv] gate inputs
    const float* b;                 // [hv]
    const float* ssm_a;             // [hv]
    const float* dt_bias;           // [hv]
    float* state;                   // [hv, dv, dk]
    const float* z;                 // [hv dv]
    const float* norm_w;            // [dv]
    float* o;                       // [hv dv]: the delta rule's outputs (scratch)
    float* out;                     // [hv dv]
    unsigned* counters;             // hk key-head counters, then hv dv / 256 slice counters
    unsigned long long p7, p5, p4;  // out prepared (Q4_K, Q8_0, Q6_K layouts) or 0
    int C, hk, hv, dk, dv;
    float eps_l2, eps;
    int pad_;
};
static_assert(sizeof(GdnStepParams) == 160, "mirrored in src/backend/cuda/ops/gdn_step.rs");

constexpr int GS_ROWS = 16;  // state rows per block: 8 warps x 2
constexpr int GS_K = 4;      // conv taps

// silu(sum_j w[j] X[j]) over X = [state rows 0..K-2 | x], in tap order (conv.cu conv_at).
__device__ __forceinline__ float gs_conv(const float (&w)[GS_K], const float (&s)[GS_K - 1], float x) {
    float y = 0.0f;
#pragma unroll
    for (int j = 0; j < GS_K - 1; ++j) y = __fadd_rn(y, __fmul_rn(w[j], s[j]));
    return siluf_(__fadd_rn(y, __fmul_rn(w[GS_K - 1], x)));
}

// The shifted conv state of channel c: rows 1..K-2 move up, x becomes the last row.
__device__ __forceinline__ void gs_shift(float* st, int C, int c, const float (&s)[GS_K - 1], float x) {
#pragma unroll
    for (int r = 0; r < GS_K - 2; ++r) st[(size_t)r * C + c] = s[r + 1];
    st[(size_t)(GS_K - 2) * C + c] = x;
}

// Block 256 threads; grid hv * dv / GS_ROWS.
KERNEL void __launch_bounds__(256) gdn_step(const GdnStepParams p) {
    __shared__ float qk[256];      // normalized q (0 .. dk-1), k (dk .. 2dk-1)
    __shared__ float vv[GS_ROWS];  // the block's v values
    __shared__ float red[8], red2[8];
    __shared__ unsigned last_kh, last_sl;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int C = p.C, hk = p.hk, dk = p.dk, dv = p.dv;
    const int bph = dv / GS_ROWS;  // blocks per value head
    const int j = blockIdx.x / bph, c0 = (blockIdx.x % bph) * GS_ROWS;
    const int kh = j % hk, kd = hk * dk;  // tiled GGUF order: value head j uses key head j mod hk
    const bool has_qk = tid < 2 * dk, has_v = tid < GS_ROWS;
    const int cqk = tid < dk ? kh * dk + tid : kd + kh * dk + (tid - dk);
    const int cv = 2 * kd + j * dv + c0 + tid;

    // Before the wait: the weights and states of this block's channels and rows.
    float wq[GS_K] = {}, sq[GS_K - 1] = {}, wv[GS_K] = {}, sv[GS_K - 1] = {};
    if (has_qk) {
#pragma unroll
        for (int k = 0; k < GS_K; ++k) wq[k] = p.conv_w[(size_t)cqk * GS_K + k];
#pragma unroll
        for (int k = 0; k < GS_K - 1; ++k) sq[k] = p.conv_state[(size_t)k * C + cqk];
    }
    if (has_v) {
#pragma unroll
        for (int k = 0; k < GS_K; ++k) wv[k] = p.conv_w[(size_t)cv * GS_K + k];
#pragma unroll
        for (int k = 0; k < GS_K - 1; ++k) sv[k] = p.conv_state[(size_t)k * C + cv];
    }
    float M[2][4];
    float* rows[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        rows[r] = p.state + ((size_t)j * dv + c0 + 2 * warp + r) * dk;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int i = lane + 32 * m;
            M[r][m] = i < dk ? rows[r][i] : 0.0f;
        }
    }
    kernel_start();

    // The conv + SiLU of this thread's channels, then the q/k L2 norm (q also times 1/sqrt(dk)).
    const float xq = has_qk ? p.qkv[cqk] : 0.0f, xv = has_v ? p.qkv[cv] : 0.0f;
    const float yq = has_qk ? gs_conv(wq, sq, xq) : 0.0f;
    if (has_v) vv[tid] = gs_conv(wv, sv, xv);
    const float ws = warp_sum(yq * yq);
    if (lane == 0) red[warp] = ws;
    __syncthreads();
    if (has_qk) {
        const int w0 = tid < dk ? 0 : dk / 32;
        float ss = 0.0f;
        for (int w = 0; w < dk / 32; ++w) ss += red[w0 + w];
        const float qscale = tid < dk ? 1.0f / sqrtf((float)dk) : 1.0f;
        qk[tid] = yq * ((1.0f / sqrtf(ss + p.eps_l2)) * qscale);
    }
    // A v channel's conv state by its owner (the key head's q/k channels at the end).
    if (has_v) gs_shift(p.conv_state, C, cv, sv, xv);
    __syncthreads();  // qk, vv written

    // The gates (common.cuh gdn_g, as gdn_gates) and the delta rule for the warp's two rows.
    const float decay = expf(gdn_g(p.a[j], p.ssm_a[j], p.dt_bias[j])), beta = sigmoidf_(p.b[j]);
    float kr[4], qr[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int i = lane + 32 * m;
        kr[m] = i < dk ? qk[dk + i] : 0.0f;
        qr[m] = i < dk ? qk[i] : 0.0f;
    }
    float kv[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int m = 0; m < 4; ++m) kv[r] = fmaf(M[r][m], kr[m], kv[r]);
    float o[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float pred = decay * warp_sum(kv[r]);
        const float delta = beta * (vv[2 * warp + r] - pred);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            M[r][m] = decay * M[r][m] + delta * kr[m];
            o[r] = fmaf(M[r][m], qr[m], o[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        o[r] = warp_sum(o[r]);
        if (lane == 0) p.o[(size_t)j * dv + c0 + 2 * warp + r] = o[r];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int i = lane + 32 * m;
            if (i < dk) rows[r][i] = M[r][m];
        }
    }

    // The block counts itself twice, both atomics in flight together (off the path to the delta
    // rule): in its key head's counter (every thread has used its old q/k conv state values above),
    // and once its outputs are visible, in its slice's counter. The key head's last block then
    // writes the shifted q/k conv state; the slice's last block takes the gated norm of its heads
    // and the prepared copies.
    const int sl = (j * dv + c0) / 256;
    __threadfence();  // this block's outputs visible on the GPU before its count
    __syncthreads();
    if (tid == 0) {
        const unsigned readers = (unsigned)(p.hv / hk * bph);
        const unsigned old_kh = atomicAdd(p.counters + kh, 1u);
        const unsigned old_sl = atomicAdd(p.counters + hk + sl, 1u);
        last_kh = old_kh == readers - 1;
        last_sl = old_sl == 256 / GS_ROWS - 1;
        if (last_kh) atomicExch(p.counters + kh, 0u);
        if (last_sl) {
            atomicExch(p.counters + hk + sl, 0u);
            __threadfence();
        }
    }
    __syncthreads();
    if (last_kh && has_qk) gs_shift(p.conv_state, C, cqk, sq, xq);
    if (!last_sl) return;
    const size_t i = (size_t)sl * 256 + tid;
    // Other blocks' outputs: from L2.
    const float y = gated_norm_in_slice(__ldcg(p.o + i), p.norm_w[tid % dv], p.z[i], dv, p.eps, red2);
    p.out[i] = y;
#if defined(__CUDACC__)
    mvtc::prep_slice_block(y, (size_t)sl, (size_t)(p.hv * dv / 256), p.p7, p.p5, p.p4);
#endif
}
