// moe.cu: MoE routing (spec/MODEL.md 7.2): softmax over all experts, top-k by repeated selection,
// renormalise (sum clamped to >= 6.1035e-5, llama.cpp's clamp), times the weights scale.
// The expert products themselves are matvec.cu's kernels with expert indirection.
#include "common.cuh"

// Is (v, i) a better pick than (bv, bi)? NaN never wins against a number; ties (and NaN pairs)
// keep the lower index, as the CPU reference's in-order scan with a strict '>'.
__device__ __forceinline__ bool route_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn != bn) return bn;
    if (!vn && v != bv) return v > bv;
    return i < bi;
}

// Slots: p0 logits [T, E], p1 ids (u32 [T, k]), p2 weights [T, k]; n0 E, n1 k; f0 scale.
// Grid: T; block 256; dynamic shared memory: E floats + E bytes.
KERNEL void moe_route(const Args a) {
    kernel_start();
    DYNAMIC_SMEM(float, pr);
    __shared__ float sh[32];
    __shared__ float bvs[8];
    __shared__ int bis[8];
    const int E = (int)a.n[0], k = (int)a.n[1];
    unsigned char* taken = reinterpret_cast<unsigned char*>(pr + E);
    const float* l = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.x * E;
    uint32_t* ids = reinterpret_cast<uint32_t*>(a.p[1]) + (size_t)blockIdx.x * k;
    float* wts = reinterpret_cast<float*>(a.p[2]) + (size_t)blockIdx.x * k;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;

    float mx = -INFINITY;
    for (int i = tid; i < E; i += blockDim.x) mx = fmaxf(mx, l[i]);
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int i = tid; i < E; i += blockDim.x) {
        pr[i] = expf(l[i] - mx);
        s += pr[i];
        taken[i] = 0;
    }
    s = block_sum(s, sh);  // ends with a barrier-protected read: pr and taken are complete
    for (int i = tid; i < E; i += blockDim.x) pr[i] = pr[i] / s;
    __syncthreads();

    float sel_sum = 0.0f;  // only thread 0's copy is used
    for (int j = 0; j < k; ++j) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = tid; i < E; i += blockDim.x)
            if (!taken[i] && route_better(pr[i], i, bv, bi)) {
                bv = pr[i];
                bi = i;
            }
        warp_pick<int, route_better>(bv, bi);
        if (lane == 0) {
            bvs[w] = bv;
            bis[w] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int q = 1; q < (int)blockDim.x / 32; ++q)
                if (route_better(bvs[q], bis[q], bv, bi)) {
                    bv = bvs[q];
                    bi = bis[q];
                }
            // k <= E: an untaken expert always exists.
            taken[bi] = 1;
            ids[j] = (uint32_t)bi;
            wts[j] = pr[bi];
            sel_sum += pr[bi];
        }
        __syncthreads();
    }
    if (tid == 0) {
        const float norm = a.f[0] / fmaxf(sel_sum, 6.1035e-5f);
        for (int j = 0; j < k; ++j) wts[j] = wts[j] * norm;
    }
}

// The same routing with one warp per token, for E <= 32 * ROUTE_PER_LANE (decode: 256 experts):
// lane l holds the probabilities of experts l, l + 32, ...; the softmax reductions and each of the
// k picks are warp shuffles, with no block barriers (the block kernel above waits at two barriers
// per pick). Same rules: NaN never wins, ties keep the lower index, the top-k sum in pick order.
// Slots as moe_route. Grid: T; block 32.
#define ROUTE_PER_LANE 16
KERNEL void moe_route_warp(const Args a) {
    kernel_start();
    const int E = (int)a.n[0], k = (int)a.n[1], lane = threadIdx.x;
    const float* l = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.x * E;
    uint32_t* ids = reinterpret_cast<uint32_t*>(a.p[1]) + (size_t)blockIdx.x * k;
    float* wts = reinterpret_cast<float*>(a.p[2]) + (size_t)blockIdx.x * k;
    float p[ROUTE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < E ? l[e] : -INFINITY;
        if (e < E) mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; ++i)
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - mx);
            s += p[i];
        }
    s = warp_sum(s);
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; ++i) p[i] = p[i] / s;

    uint32_t taken = 0;  // bit i: expert lane + 32 i is taken
    float sel_sum = 0.0f;  // the same in every lane
    float mine = 0.0f;     // lane j < 32: the probability of pick j
    for (int j = 0; j < k; ++j) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < ROUTE_PER_LANE; ++i) {
            const int e = lane + 32 * i;
            if (e < E && !((taken >> i) & 1u) && route_better(p[i], e, bv, bi)) {
                bv = p[i];
                bi = e;
            }
        }
        warp_pick<int, route_better>(bv, bi);  // every lane gets the pick; k <= E: bi >= 0
        if (bi % 32 == lane) taken |= 1u << (bi / 32);
        if (lane == 0) {
            ids[j] = (uint32_t)bi;
            if (j >= 32) wts[j] = bv;
        }
        if (lane == j) mine = bv;
        sel_sum += bv;
    }
    // Each weight scaled by the lane that holds it: no read-back of stores still in flight, which
    // cost one L2 round trip per pick in series (the routing is on the decode step's critical path).
    const float norm = a.f[0] / fmaxf(sel_sum, 6.1035e-5f);
    if (lane < k) wts[lane] = mine * norm;
    if (lane == 0)  // more picks than lanes (no Qwen3.5 shape): read back
        for (int j = 32; j < k; ++j) wts[j] = wts[j] * norm;
}
