// moe.cu: MoE routing (spec/MODEL.md 7.2): softmax over all experts, top-k by repeated selection,
// renormalise (sum clamped to >= 6.1035e-5, llama.cpp's clamp), times the weights scale.
// The expert products themselves are matvec.cu's kernels with expert indirection.
#include "common.cuh"
#include "route.cuh"

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

// The same routing by rank, for E <= 256 * ROUTE_PER_THREAD (decode: 256 experts): route.cuh
// `route_rank_block`. Slots as moe_route. Grid: T; block 256.
KERNEL void __launch_bounds__(256) moe_route_rank(const Args a) {
    kernel_start();
    __shared__ RouteSmem sm;
    const int E = (int)a.n[0], k = (int)a.n[1];
    const float* l = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.x * E;
    uint32_t* ids = reinterpret_cast<uint32_t*>(a.p[1]) + (size_t)blockIdx.x * k;
    float* wts = reinterpret_cast<float*>(a.p[2]) + (size_t)blockIdx.x * k;
    route_rank_block(l, E, k, a.f[0], ids, wts, sm);
}
