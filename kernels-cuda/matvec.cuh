// matvec.cuh: matrix-vector products on weights in their GGUF block formats (the decode path, and
// the expert products of MoE at any batch size).
//
//   out[v][o] = sum_i W[o][i] * x[v][i]          for each output vector v (grid.y)
//
// Decode is memory-bound: for one token the time is the weight bytes read. So each weight byte is
// read once, with 16-byte loads (formats.cuh), whole units of 32 elements are decoded in registers
// and each activation unit is loaded once per thread and reused for all the rows the thread owns.
//
// Work split of a block (256 threads): thread t = (rg, ut) with ut = t % UT the *unit lane* and
// rg = t / UT the *row group* (RG = 256 / UT groups). The block owns RG * RPT consecutive rows;
// thread (rg, ut) owns rows rg, rg + RG, ... (RPT of them) and units ut, ut + UT, ... of each.
// With UT >= 32 a warp reads 32 consecutive units of one row: contiguous bytes. The partial sums
// of a row are reduced over the UT threads of its group (warp shuffles, then shared memory).
//
// The activations are copied once per block into shared memory, padded to 36 floats per unit so
// that the 16-byte reads of 8 consecutive units hit different banks; when they do not fit
// (very long rows, many MoE vectors) they are read from global memory instead (x_in_smem = 0).
//
// Batching (grid.y = output vectors, all uniform over a block):
//   - dense T tokens:    vector v uses x[v], W, writes out[v];
//   - MoE gate/up (GLU): entry b = t*k + j uses x[b / k], expert ids[b] (W and W2), writes
//                        out[b] = silu(W_gate x) * (W_up x);
//   - MoE down (nsum = k): out[t] = sum_j scales[t*k+j] * W_{ids[t*k+j]} x[t*k+j], summed in a
//                        fixed order inside the block (no atomics: reproducible).
//   - either with a shared expert: k + 1 entries per token, the last one the shared expert's
//                        (common.cuh `MvShared`).
// Expert ids at or past n_experts contribute nothing (the CPU backend rejects them).
//
// Grouped products (dense, one weight each): the grid's x blocks span several matrices of one
// format and x (common.cuh's segment table); a block works on its segment's matrix exactly as it
// would in a launch of its own, so a group's outputs are bit for bit those of separate launches
// with the same UT and RPT.
#pragma once

#include "formats.cuh"

#define MV_THREADS 256
#define MV_RPT_MAX 8  // rows per thread, plain products
#define MV_RPT_MAX_GLU 4  // rows per thread with two weights (gate and up)
#define MV_XPAD 36  // floats per unit in shared memory (32 + 4 of padding)
#define MV_EIDS 64   // MoE entries per output whose expert ids a block keeps in shared memory

// Segments a plain kernel of format F takes (common.cuh): a group, except for F16 and BF16, whose
// kernels sit at the 128-register bound of two blocks per SM and would spill with a per-block
// weight and output pointer (ptxas -v: 96 bytes; their files have no grouped products worth it).
// ops/linear.rs `takes_group` says the same.
template <class F>
struct MvSegs {
    static constexpr int N = MV_SEGS;
};
template <>
struct MvSegs<FmtF16> {
    static constexpr int N = 1;
};
template <>
struct MvSegs<FmtBF16> {
    static constexpr int N = 1;
};

// The end of a matvec block: reduce each of the thread's RPT rows over the UT threads of its row
// group (within warps, then across the UT/32 warps through `red`) and write out[ov][row]
// (silu(gate) * up for GLU). `red` is [MV_THREADS/32][RPT_MAX * (GLU ? 2 : 1)].
template <int RPT_MAX, bool GLU>
__device__ __forceinline__ void mv_reduce_store(const float (&acc)[RPT_MAX], const float (&accu)[RPT_MAX],
                                                float (*red)[RPT_MAX * (GLU ? 2 : 1)], int UT, int RPT, int row0,
                                                int n_out, float* out_v) {
    const int t = threadIdx.x, w = t / 32, lane = t % 32, RG = MV_THREADS / UT;
#pragma unroll
    for (int i = 0; i < RPT_MAX; ++i) {
        if (i < RPT) {
            const float g = warp_sum(acc[i]);
            const float v = GLU ? warp_sum(accu[i]) : 0.0f;
            if (lane == 0) {
                red[w][i] = g;
                if (GLU) red[w][RPT_MAX + i] = v;
            }
        }
    }
    __syncthreads();
    const int warps_per_group = UT / 32 > 0 ? UT / 32 : 1;
    if (t < RG * RPT) {
        const int g_ = t % RG, i = t / RG;  // local row t = g_ + RG * i
        const int row = row0 + t;
        if (row < n_out) {
            float g = 0.0f, v = 0.0f;
            for (int k = 0; k < warps_per_group; ++k) {
                g += red[g_ * warps_per_group + k][i];
                if (GLU) v += red[g_ * warps_per_group + k][RPT_MAX + i];
            }
            out_v[row] = GLU ? siluf_(g) * v : g;
        }
    }
}

// The slots every matvec kernel shares (below), as locals named after them: W, out and n_out are
// this block's segment's (common.cuh `mv_segment`, of the first SEGS), `blk` the block's index
// within it.
#define MV_SLOTS(a, SEGS)                                                               \
    const MvSeg seg_ = mv_segment<SEGS>(a);                                             \
    const int blk = (int)blockIdx.x - seg_.block0;                                      \
    const uint8_t* W = reinterpret_cast<const uint8_t*>(seg_.w);                        \
    const uint8_t* W2 = reinterpret_cast<const uint8_t*>((a).p[1]);                     \
    const float* X = reinterpret_cast<const float*>((a).p[2]);                          \
    float* out = reinterpret_cast<float*>(seg_.out);                                    \
    const uint32_t* ids = reinterpret_cast<const uint32_t*>((a).p[4]);                  \
    const float* scales = reinterpret_cast<const float*>((a).p[5]);                     \
    const int n_out = seg_.rows, n_in = (int)(a).n[1];                                  \
    const size_t row_bytes = (size_t)(a).n[2], expert_bytes = (size_t)(a).n[3];         \
    const uint32_t n_experts = (uint32_t)(a).n[4];                                      \
    const int x_group = (int)(a).n[5], nsum = (int)(a).n[6];                            \
    const int UT = (int)(a).n[7], RPT = (int)(a).n[8];                                  \
    const size_t out_stride = (size_t)n_out, x_stride = (size_t)(a).n[11]

// Slots: the segment table (W, out, n_out of each product; several only for plain products of
//        the formats of MvSegs: not GLU, no experts), p1 W2 (GLU up weights or 0), p2 x, p4 expert ids (u32) or 0,
//        p5 scales or 0, p3 and p7 the shared expert (SHARED: common.cuh mv_shared_slots).
//        n1 n_in, n2 row_bytes, n3 expert_bytes, n4 n_experts, n5 x_group, n6 nsum, n7 UT, n8 RPT,
//        n9 x_in_smem, n11 x_stride (floats). Output vector v of a segment lies at out + v * n_out.
template <class F, bool GLU, bool SHARED = false>
__device__ __forceinline__ void matvec(const Args& a) {
    constexpr int SEGS = GLU || SHARED ? 1 : MvSegs<F>::N;  // expert products run one
    constexpr int RPT_MAX = GLU ? MV_RPT_MAX_GLU : MV_RPT_MAX;
    DYNAMIC_SMEM(float4, smem4);
    float* xs = reinterpret_cast<float*>(smem4);
    __shared__ float red[MV_THREADS / 32][RPT_MAX * (GLU ? 2 : 1)];

    MV_SLOTS(a, SEGS);
    const bool x_in_smem = a.n[9] != 0;
    const MvShared shx = mv_shared_slots<GLU>(a, x_group * nsum);

    const int t = threadIdx.x, ut = t % UT, rg = t / UT, RG = MV_THREADS / UT;
    const int rows_per_block = RG * RPT;
    const int row0 = blk * rows_per_block;
    const int ov = blockIdx.y;  // output vector
    const int units = (n_in + 31) / 32;

    if (ids == nullptr) mv_prefetch_rows(W, GLU ? W2 : nullptr, row0, min(rows_per_block, n_out - row0), row_bytes);
    kernel_start();
    if (ids != nullptr && nsum > 1 && !GLU)
        mv_prefetch_entries<SHARED>(W, ids, shx, ov, nsum, n_experts, expert_bytes, row0,
                                    min(rows_per_block, n_out - row0), row_bytes);
    // A MoE sum's expert ids, read once here, before the barrier below, rather than one L2 round
    // trip per entry in series in the loop (the 35B-A3B's downs sum 9 entries).
    __shared__ uint32_t eid[MV_EIDS];
    const bool eid_smem = ids != nullptr && nsum > 1 && nsum <= MV_EIDS;
    if (eid_smem)
        for (int j = t; j < nsum; j += MV_THREADS) {
            int tok;
            const int b = ov * nsum + j;
            eid[j] = mv_shared_entry<SHARED>(shx, b, tok) ? 0u : ids[b - tok];
        }

    // The activation vectors of this block, one per summed entry, in one pass over all of them:
    // four values per load through the read-only path, every load of a thread independent and in
    // flight at once (one element, or one entry, per round trip was a prologue as long as a small
    // block's whole share of the weights).
    if (x_in_smem) {
        const int per = units * 8;  // float4s per entry
#pragma unroll 4
        for (int i = t; i < nsum * per; i += MV_THREADS) {
            const int j = i / per, q = i - j * per;
            const float* xv = X + (size_t)((ov * nsum + j) / x_group) * x_stride;
            const int e = 4 * q;  // first of the four elements
            float4 v;
            if (n_in % 4 == 0 && (reinterpret_cast<uintptr_t>(xv) & 15) == 0 && e + 4 <= n_in) {
                v = __ldg(reinterpret_cast<const float4*>(xv) + q);
            } else {
                v.x = e < n_in ? xv[e] : 0.0f;
                v.y = e + 1 < n_in ? xv[e + 1] : 0.0f;
                v.z = e + 2 < n_in ? xv[e + 2] : 0.0f;
                v.w = e + 3 < n_in ? xv[e + 3] : 0.0f;
            }
            *reinterpret_cast<float4*>(xs + (size_t)j * units * MV_XPAD + (e / 32) * MV_XPAD + (e % 32)) = v;
        }
    }
    if (x_in_smem || eid_smem) __syncthreads();

    float acc[RPT_MAX], accu[RPT_MAX];
#pragma unroll
    for (int i = 0; i < RPT_MAX; ++i) acc[i] = accu[i] = 0.0f;

    // A MoE sum over rows shorter than the unit lanes (the 35B-A3B's downs: 16 units of n_ff 512
    // on 32 lanes) would leave lanes idle while the entries run in series: the lanes then split
    // into groups of u2 (the units rounded up to a power of two), group q taking the entries q,
    // q + UT / u2, ... (each lane's terms still meet in the row group's warp sum).
    int u2 = 1;
    while (u2 < units) u2 <<= 1;
    const int egroups = !GLU && nsum > 1 && 2 * u2 <= UT ? UT / u2 : 1;
    const int ulane = egroups > 1 ? ut % u2 : ut, ustep = egroups > 1 ? u2 : UT;

    for (int j = egroups > 1 ? ut / u2 : 0; j < nsum; j += egroups) {
        const int b = ov * nsum + j;
        int tok;
        const bool shared = mv_shared_entry<SHARED>(shx, b, tok);
        uint32_t e = 0;
        if (ids != nullptr && !shared) {
            e = eid_smem ? eid[j] : ids[b - tok];
            if (e >= n_experts) continue;  // no barrier below before the loop ends
        }
        const uint8_t* We = shared ? shx.w : W + (size_t)e * expert_bytes;
        const uint8_t* W2e = GLU ? (shared ? shx.w2 : W2 + (size_t)e * expert_bytes) : nullptr;
        const float* xg = X + (size_t)(b / x_group) * x_stride;
        const float* xsj = xs + (size_t)j * units * MV_XPAD;
        float sg[RPT_MAX], su[RPT_MAX];
#pragma unroll
        for (int i = 0; i < RPT_MAX; ++i) sg[i] = su[i] = 0.0f;

        for (int u = ulane; u < units; u += ustep) {
            // This unit's 32 activations.
            float xr[32];
            if (x_in_smem) {
                const float4* p = reinterpret_cast<const float4*>(xsj + (size_t)u * MV_XPAD);
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const float4 v = p[q];
                    xr[4 * q] = v.x;
                    xr[4 * q + 1] = v.y;
                    xr[4 * q + 2] = v.z;
                    xr[4 * q + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 32; ++i) xr[i] = (32 * u + i < n_in) ? xg[32 * u + i] : 0.0f;
            }
            // Sums of each half unit, for the formats with an additive constant per half.
            float2 sx = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                sx.x += xr[i];
                sx.y += xr[16 + i];
            }

#pragma unroll
            for (int i = 0; i < RPT_MAX; ++i) {
                const int row = row0 + rg + RG * i;
                if (i < RPT && row < n_out) {
                    sg[i] += dot_unit<F>(We + (size_t)row * row_bytes, u, n_in, xr, sx);
                    if (GLU) su[i] += dot_unit<F>(W2e + (size_t)row * row_bytes, u, n_in, xr, sx);
                }
            }
        }
        const float s = shared ? mv_shared_scale(shx, tok) : scales != nullptr ? scales[b - tok] : 1.0f;
#pragma unroll
        for (int i = 0; i < RPT_MAX; ++i) {
            acc[i] += s * sg[i];
            if (GLU) accu[i] += s * su[i];
        }
    }

    mv_reduce_store<RPT_MAX, GLU>(acc, accu, red, UT, RPT, row0, n_out, out + (size_t)ov * out_stride);
}

