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

// The same routing by rank, for E <= 256 * ROUTE_PER_THREAD (decode: 256 experts). route_better's
// order is a total order, so an expert's place among the picks is the number of experts that beat
// it: each thread counts that for its experts (i, i + 256, ...) against every key in shared memory,
// and the experts with rank < k write themselves as pick `rank`. One parallel pass instead of k
// selections in series (a single warp selecting 8 of 256 took ~17 us per layer on the H200, a
// chain of dependent compares and shuffles). Key: probability bits + 1 (probabilities are >= 0, so
// their bits order as the values), NaN 0 (never beats a number); ties go to the lower index by
// counting an equal key as better only before the expert's own index. The top-k sum is added in
// pick order, as the CPU reference does. Slots as moe_route. Grid: T; block 256.
#define ROUTE_PER_THREAD 4
KERNEL void __launch_bounds__(256) moe_route_rank(const Args a) {
    kernel_start();
    __shared__ __align__(16) uint32_t key[256 * ROUTE_PER_THREAD];
    __shared__ float picked[256 * ROUTE_PER_THREAD];  // probability of pick r
    __shared__ float sh[32];
    const int E = (int)a.n[0], k = (int)a.n[1], tid = threadIdx.x;
    const float* l = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.x * E;
    uint32_t* ids = reinterpret_cast<uint32_t*>(a.p[1]) + (size_t)blockIdx.x * k;
    float* wts = reinterpret_cast<float*>(a.p[2]) + (size_t)blockIdx.x * k;
    float p[ROUTE_PER_THREAD];
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        p[q] = e < E ? l[e] : -INFINITY;
        if (e < E) mx = fmaxf(mx, p[q]);
    }
    mx = block_max(mx, sh);
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q)
        if (tid + 256 * q < E) {
            p[q] = expf(p[q] - mx);
            s += p[q];
        }
    s = block_sum(s, sh);
    // Keys past E up to a multiple of 4 are 0: they beat nothing (a key 0 ties only with a NaN,
    // and an index past E is never below the expert's own).
    const int E4 = (E + 3) & ~3;
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        p[q] = p[q] / s;
        if (e < E4) key[e] = e < E ? (isnan(p[q]) ? 0u : __float_as_uint(p[q]) + 1u) : 0u;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < ROUTE_PER_THREAD; ++q) {
        const int e = tid + 256 * q;
        if (e >= E) break;
        const uint32_t me = key[e];
        // Four keys per (broadcast) load, the loads independent of the counting: the loop is not
        // one shared-memory round trip per key. A key beats e's if larger, or equal at a lower index.
        int rank = 0;
#pragma unroll 4
        for (int j = 0; j < E4; j += 4) {
            const uint4 v = *reinterpret_cast<const uint4*>(key + j);
            rank += (v.x > me || (v.x == me && j < e)) + (v.y > me || (v.y == me && j + 1 < e)) +
                    (v.z > me || (v.z == me && j + 2 < e)) + (v.w > me || (v.w == me && j + 3 < e));
        }
        if (rank < k) {
            ids[rank] = (uint32_t)e;
            picked[rank] = p[q];
        }
    }
    __syncthreads();
    if (tid == 0) {
        float sel_sum = 0.0f;
        for (int r = 0; r < k; ++r) sel_sum += picked[r];
        sh[0] = a.f[0] / fmaxf(sel_sum, 6.1035e-5f);
    }
    __syncthreads();
    for (int r = tid; r < k; r += 256) wts[r] = picked[r] * sh[0];
}
