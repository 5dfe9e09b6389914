// delta_rule.cu: the gated delta rule, token by token, row-owned (spec/DELTANET.md A.2, A.3).
//
// The state of value head j is M = S^T, [dv][dk] value-major: row c (a value index) is contiguous
// over the key index i and evolves on its own given the token's k, q and the scalars g, beta,
// v[c]:
//     pred  = e^g * sum_i M[c][i] k[i]
//     delta = beta * (v[c] - pred)
//     M[c][i] = e^g * M[c][i] + delta * k[i]
//     o[c]  = sum_i M[c][i] q[i]
// One warp owns one row c; lane l holds M[c][l + 32m] in registers for the whole batch of tokens
// (reads and writes of a row are contiguous), the two sums are warp reductions. The q/k/v/g/beta
// reads and the output write are in the same kernel; the state is read and written once per call.
// Never a reduction over a column of M (the column-owned bug of DELTANET.md A.4).
//
// The same kernel serves prefill (T tokens in sequence, state kept in registers); the chunked
// tensor-core algorithm replaces it there later (delta_chunked*.cu).
#include "common.cuh"
#include "delta_token.cuh"

// Slots: p0 u [T, conv_dim] (q | k | v, q/k already normalised and q scaled), p1 g [T, Hv],
// p2 beta [T, Hv], p3 state [Hv, dv, dk], p4 out [T, Hv*dv]; n0 T, n1 hk, n2 hv, n3 dk, n4 dv.
// Grid: (Hv, ceil(dv / 4)); block 128 (4 rows). DR_MAXC = ceil(dk / 32) columns per lane at most.
template <int DR_MAXC>
__device__ __forceinline__ void delta_rule(const Args& a) {
    kernel_start();
    const float* u = reinterpret_cast<const float*>(a.p[0]);
    const float* g = reinterpret_cast<const float*>(a.p[1]);
    const float* beta = reinterpret_cast<const float*>(a.p[2]);
    float* state = reinterpret_cast<float*>(a.p[3]);
    float* out = reinterpret_cast<float*>(a.p[4]);
    const int T = (int)a.n[0], hk = (int)a.n[1], hv = (int)a.n[2], dk = (int)a.n[3], dv = (int)a.n[4];
    const int j = blockIdx.x;
    const int c = blockIdx.y * 4 + (int)threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (c >= dv) return;  // whole warps only: no block barrier below
    const int kh = j % hk;  // tiled GGUF order: value head j uses key head j mod hk
    const int kd = hk * dk, cd = 2 * kd + hv * dv;
    float* row = state + ((size_t)j * dv + c) * dk;

    float M[DR_MAXC];
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        const int i = lane + 32 * m;
        M[m] = i < dk ? row[i] : 0.0f;
    }
    for (int t = 0; t < T; ++t) {
        const float* ut = u + (size_t)t * cd;
        const float* q = ut + kh * dk;
        const float* k = ut + kd + kh * dk;
        const float v = ut[2 * kd + j * dv + c];
        const float decay = expf(g[(size_t)t * hv + j]);
        const float b = beta[(size_t)t * hv + j];
        const float o = delta_token<DR_MAXC>(M, q, k, v, decay, b, dk, lane);
        if (lane == 0) out[(size_t)t * hv * dv + (size_t)j * dv + c] = o;
    }
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        const int i = lane + 32 * m;
        if (i < dk) row[i] = M[m];
    }
}

// One instantiation per register budget: dk <= 128 (the Qwen3.5 models), 256, 512.
KERNEL void __launch_bounds__(128) delta_rule_4(const Args a) { delta_rule<4>(a); }
KERNEL void __launch_bounds__(128) delta_rule_8(const Args a) { delta_rule<8>(a); }
KERNEL void __launch_bounds__(128) delta_rule_16(const Args a) { delta_rule<16>(a); }
