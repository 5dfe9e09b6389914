// route.cuh: MoE routing by rank (spec/MODEL.md 7.2), the body of moe.cu's `moe_route_rank` and
// of norm.cu's `moe_norm_route` (whose last block routes the logits the others wrote).
#pragma once

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

#define ROUTE_PER_THREAD 4

// What route_rank_block keeps in shared memory.
struct RouteSmem {
    __align__(16) uint32_t key[256 * ROUTE_PER_THREAD];
    float picked[256 * ROUTE_PER_THREAD];  // probability of pick r
    float sh[32];
};

// One token's routing by 256 threads, for E <= 256 * ROUTE_PER_THREAD: softmax over the E logits
// at l, the top k written to ids (u32) and their probabilities, renormalised (sum clamped to >=
// 6.1035e-5, llama.cpp's clamp) and times `scale`, to wts. route_better's order is a total order,
// so an expert's place among the picks is the number of experts that beat it: each thread counts
// that for its experts (i, i + 256, ...) against every key in shared memory, and the experts with
// rank < k write themselves as pick `rank`. One parallel pass instead of k selections in series (a
// single warp selecting 8 of 256 took ~17 us per layer on the H200, a chain of dependent compares
// and shuffles). Key: probability bits + 1 (probabilities are >= 0, so their bits order as the
// values), NaN 0 (never beats a number); ties go to the lower index by counting an equal key as
// better only before the expert's own index. The top-k sum is added in pick order, as the CPU
// reference does. The logits are read from L2 (another block of the same launch may have written
// them).
__device__ __forceinline__ void route_rank_block(const float* l, int E, int k, float scale, uint32_t* ids, float* wts,
                                                 RouteSmem& sm) {
    const int tid = threadIdx.x;
    float p[ROUTE_PER_THREAD];
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        p[q] = e < E ? __ldcg(l + e) : -INFINITY;
        if (e < E) mx = fmaxf(mx, p[q]);
    }
    mx = block_max(mx, sm.sh);
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q)
        if (tid + 256 * q < E) {
            p[q] = expf(p[q] - mx);
            s += p[q];
        }
    s = block_sum(s, sm.sh);
    // Keys past E up to a multiple of 4 are 0: they beat nothing (a key 0 ties only with a NaN,
    // and an index past E is never below the expert's own).
    const int E4 = (E + 3) & ~3;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        p[q] = p[q] / s;
        if (e < E4) sm.key[e] = e < E ? (isnan(p[q]) ? 0u : __float_as_uint(p[q]) + 1u) : 0u;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        if (e >= E) break;
        const uint32_t me = sm.key[e];
        // Four keys per (broadcast) load, the loads independent of the counting: the loop is not
        // one shared-memory round trip per key. A key beats e's if larger, or equal at a lower index.
        int rank = 0;
#pragma unroll 4
        for (int j = 0; j < E4; j += 4) {
            const uint4 v = *reinterpret_cast<const uint4*>(sm.key + j);
            rank += (v.x > me || (v.x == me && j < e)) + (v.y > me || (v.y == me && j + 1 < e)) +
                    (v.z > me || (v.z == me && j + 2 < e)) + (v.w > me || (v.w == me && j + 3 < e));
        }
        if (rank < k) {
            ids[rank] = (uint32_t)e;
            sm.picked[rank] = p[q];
        }
    }
    __syncthreads();
    if (tid == 0) {
        float sel_sum = 0.0f;
        for (int r = 0; r < k; ++r) sel_sum += sm.picked[r];
        sm.sh[0] = scale / fmaxf(sel_sum, 6.1035e-5f);
    }
    __syncthreads();
    for (int r = tid; r < k; r += 256) wts[r] = sm.picked[r] * sm.sh[0];
}
