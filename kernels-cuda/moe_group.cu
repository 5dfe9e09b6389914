// moe_group.cu: MoE prefill without a per-token loop. The T x k routing choices (ids [T, k]) are
// grouped by expert into "slots" (expert-major, token order inside an expert), so that each
// projection is one grouped GEMM over all experts (gemm_q.cu, grouped mode):
//
//   pf_moe_count    counts[e] = number of (t, j) with ids[t][j] = e   (counts zeroed by the host);
//                   slot_of[] = -1 (an id >= E is never placed and contributes nothing)
//   pf_moe_offsets  offsets[e] = exclusive prefix of counts; the GEMM tile list: for every expert
//                   ceil(counts[e] / bm) tiles {e, row_begin, row_end, 0} over slot rows, and
//                   num_tiles (one CTA, E <= 1024)
//   pf_moe_place    slot_token[s] = token of slot s; slot_of[t k + j] = slot of choice (t, j).
//                   One CTA per expert ranks its choices by ballots: deterministic, no atomics
//   grouped GEMMs   gate, up: x rows gathered through slot_token; y [slots, n_ff] in slot order;
//                   pf_swiglu_f16 (gemm_q.cu) -> h [slots, n_ff] f16; down: y [slots, d]
//   pf_moe_combine  out[t] = sum_j weights[t][j] * y[slot_of[t k + j]]   (j in order)
//
// The grouped GEMM is launched with grid.y = ceil(T k / bm) + E (an upper bound of the tile
// count, known on the host without a device read); CTAs past num_tiles exit at once.
#include "pf_common.cuh"

namespace pf {
// One parameter block for the four kernels (each reads the fields it names); the Rust backend
// mirrors it (src/backend/cuda/ops/moe.rs).
struct MoeParams {
    const uint32_t* ids;  // [T, k] routing choices
    int* counts;          // [E]
    int* offsets;         // [E + 1]
    int4* tiles;          // GEMM tile list
    int* num_tiles;
    int* slot_token;      // [T k]
    int* slot_of;         // [T k]
    const float* y;       // combine: [T k, d] down-projection rows in slot order
    const float* weights; // combine: [T, k]
    float* out;           // combine: [T, d]
    int n;                // T k
    int n_expert, k, bm, d;
};
static_assert(sizeof(MoeParams) == 104, "mirrored in src/backend/cuda/ops/moe.rs");
}  // namespace pf

extern "C" __global__ void pf_moe_count(pf::MoeParams p) {
    pf::kernel_start();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) {
        const uint32_t e = p.ids[i];
        if (e < static_cast<uint32_t>(p.n_expert)) atomicAdd(p.counts + e, 1);
        p.slot_of[i] = -1;  // stays -1 for an id out of range: pf_moe_combine skips it
    }
}

// Exclusive scan of one value per thread of a block of up to 1024 threads; returns the prefix
// and writes the block total to *total (shared).
static __device__ __forceinline__ int pf_block_excl_scan(int v, int* warp_sums, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    int s = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += t;
    }
    if (lane == 31) warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += t;
        }
        if (lane < nwarps) warp_sums[lane] = w;  // inclusive prefix of warp sums
        if (lane == nwarps - 1) *total = w;
    }
    __syncthreads();
    const int excl = s - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    __syncthreads();  // warp_sums may be reused by the caller
    return excl;
}

// One CTA of 1024 threads (blockDim.x must be a multiple of 32 and >= n_expert).
extern "C" __global__ void pf_moe_offsets(pf::MoeParams p) {
    pf::kernel_start();
    const int* __restrict__ counts = p.counts;
    const int n_expert = p.n_expert, bm = p.bm;
    int* __restrict__ offsets = p.offsets;
    int4* __restrict__ tiles = p.tiles;
    __shared__ int warp_sums[32];
    __shared__ int total_rows, total_tiles;
    const int e = threadIdx.x;
    const int cnt = e < n_expert ? counts[e] : 0;
    const int off = pf_block_excl_scan(cnt, warp_sums, &total_rows);
    const int nt = (cnt + bm - 1) / bm;
    const int toff = pf_block_excl_scan(nt, warp_sums, &total_tiles);
    if (e < n_expert) {
        offsets[e] = off;
        for (int i = 0; i < nt; i++)
            tiles[toff + i] = make_int4(e, off + i * bm, min(off + (i + 1) * bm, off + cnt), 0);
    }
    if (e == 0) {
        offsets[n_expert] = total_rows;
        *p.num_tiles = total_tiles;
    }
}

// grid n_expert CTAs, 256 threads.
extern "C" __global__ void pf_moe_place(pf::MoeParams p) {
    pf::kernel_start();
    const uint32_t* __restrict__ ids = p.ids;
    const int n = p.n, k = p.k;
    int* __restrict__ slot_token = p.slot_token;
    int* __restrict__ slot_of = p.slot_of;
    __shared__ int warp_cnt[8];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int base = p.offsets[e];
    for (int i0 = 0; i0 < n; i0 += 256) {
        const int i = i0 + threadIdx.x;
        const bool hit = i < n && ids[i] == static_cast<uint32_t>(e);
        const unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_cnt[warp] = __popc(mask);
        __syncthreads();
        int before = 0, all = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const int c = warp_cnt[w];
            before += w < warp ? c : 0;
            all += c;
        }
        if (hit) {
            const int slot = base + before + __popc(mask & ((1u << lane) - 1u));
            slot_token[slot] = i / k;
            slot_of[i] = slot;
        }
        base += all;
        __syncthreads();
    }
}

// grid T CTAs, 256 threads: out[t][:] = sum_j w[t][j] y[slot_of[t k + j]][:].
extern "C" __global__ void pf_moe_combine(pf::MoeParams p) {
    pf::kernel_start();
    const float* __restrict__ y = p.y;
    const int* __restrict__ slot_of = p.slot_of;
    const float* __restrict__ weights = p.weights;
    float* __restrict__ out = p.out;
    const int k = p.k, d = p.d;
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float s = 0.f;
        for (int j = 0; j < k; j++) {
            const int sl = slot_of[t * k + j];
            if (sl >= 0) s += weights[t * k + j] * y[static_cast<long long>(sl) * d + c];
        }
        out[static_cast<long long>(t) * d + c] = s;
    }
}
