// mvtc_pf.cuh: the tensor-core products (Q4_K, Q8_0, Q6_K) with weights pulled into L2 ahead of
// their loads, for dev/cuda/matvec_bench.cu (variants `tcL<d>`, `tcP<d>`).
//
// A warp of the production loop has one step's weight loads in flight (Q6_K: one super-block of
// its 16R rows), none while it computes, and the register double buffer that fixed that for Q8_0
// costs Q4_K and Q6_K the registers of a block per SM (NOTES.md, eighteenth session). An L2
// prefetch holds no register: the loads it precedes then wait for L2, not for HBM.
//   - `L<d>`: each warp prefetches the step d steps ahead of the one it loads (the first d before the
//     dependent-launch wait): for products whose rows are long enough for several steps per warp.
//   - `P<d>`: a grid of resident blocks (the occupancy limit) loops over 16R-row tiles; a tile's
//     rows are contiguous, and each block prefetches the tile d tiles ahead of the one it computes
//     (the first d before the wait): for the LM head, whose rows are 2 steps per warp.
#pragma once

#include "matvec_tc.cuh"
#include "matvec_tc6.cuh"
#include "matvec_tc8.cuh"

namespace mvpf {

// [p, p + n) into L2, one 128-byte line per thread and pass.
static __device__ __forceinline__ void pf_range(const uint8_t* p, size_t n) {
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)127, end = reinterpret_cast<uintptr_t>(p) + n;
    for (uintptr_t a = a0 + 128 * threadIdx.x; a < end; a += 128 * (uintptr_t)blockDim.x)
        prefetch_l2(reinterpret_cast<const void*>(a));
}

// This lane's share of one step of the warp's 16R rows: the step's SB bytes at `a` of row
// (lane mod 16R) (`a` already offset to the step), lines a + 128k clamped to the step's last byte.
template <int R, int SB>
static __device__ __forceinline__ void pf_step(const uint8_t* a) {
    constexpr int LPR = 32 / (16 * R);         // lanes per row
    constexpr int K = (SB - 1 + 127) / 128;    // lines a + 128k, k = 0..K
    const int h = (threadIdx.x & 31) / (16 * R);
#pragma unroll
    for (int k = 0; k <= K; k += LPR)
        if (k + h <= K) prefetch_l2(a + min(128 * (k + h), SB - 1));
}

// The row this lane prefetches for (lane mod 16R of the block's rows, the last row repeated).
template <int R>
static __device__ __forceinline__ const uint8_t* pf_row(const uint8_t* w, int row0, int n_out, size_t row_bytes) {
    const int r = (threadIdx.x & 31) % (16 * R);
    return w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
}

// --- Q4_K, Q8_0: the policies' load / math split (matvec_tc.cuh rows_plain) with the prefetch.
template <class F, int R, int SB, int PD>
static __device__ __forceinline__ void rows_pf(const uint8_t* const (&w)[2 * R], const uint8_t* prow,
                                               const uint32_t* xa, const float* xs, int n, int first, int step,
                                               float (&part)[2 * R]) {
    typename F::template Acc<R> c;
    F::template zero<R>(c);
    for (int i = first; i < n; i += step) {
        if (PD > 0 && i + PD * step < n) pf_step<R, SB>(prow + (size_t)(i + PD * step) * SB);
        typename F::template W<R> v;
        F::template load<R>(w, i, v);
        F::template math<R>(v, i, xa, xs, c);
    }
#pragma unroll
    for (int r = 0; r < 2 * R; r++) part[r] = F::template result<R>(c, r);
}

// --- Q6_K: the per-offset loop (matvec_tc6.cuh q6k_loop) with the prefetch.
template <int R, int OFF, int PD>
static __device__ __forceinline__ void q6_loop(int first, int step, const uint8_t* const (&rows)[2 * R],
                                               const uint8_t* prow, const uint32_t* xbp, const float* xs, int nsb,
                                               float (&acc)[2 * R]) {
    for (int sb = first; sb < nsb; sb += step) {
        if (PD > 0 && sb + PD * step < nsb) pf_step<R, 210>(prow + (size_t)(sb + PD * step) * 210);
        mvtc6::Row6 rw[2 * R];
        mvtc6::q6k_load<R, OFF>(rows, sb, rw);
        mvtc6::q6k_math<R>(rw, sb, xbp, xs, acc);
    }
}
template <int R, int PD>
static __device__ __forceinline__ void q6_rows(const uint8_t* const (&rows)[2 * R], const uint8_t* prow,
                                               const uint32_t* xb, const float* xs, int nsb, float (&acc)[2 * R]) {
    constexpr int KW = mvtc6::KW;
    const int warp = threadIdx.x >> 5;
    switch (warp) {
        case 0: q6_loop<R, 0, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 1: q6_loop<R, 2, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 2: q6_loop<R, 4, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 3: q6_loop<R, 6, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 4: q6_loop<R, 8, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 5: q6_loop<R, 10, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        case 6: q6_loop<R, 12, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
        default: q6_loop<R, 14, PD>(warp, KW, rows, prow, xb, xs, nsb, acc); break;
    }
}

// The prepared x of each format's harness Args.
static __device__ __forceinline__ const uint32_t* words(const mvtc::Args& p) { return p.xa; }
static __device__ __forceinline__ const float* sums(const mvtc::Args& p) { return p.xs; }
static __device__ __forceinline__ const uint32_t* words(const mvtc8::Args& p) { return p.xb; }
static __device__ __forceinline__ const float* sums(const mvtc8::Args& p) { return p.xf; }
static __device__ __forceinline__ const uint32_t* words(const mvtc6::Args& p) { return p.xb; }
static __device__ __forceinline__ const float* sums(const mvtc6::Args& p) { return p.xs; }

// One 16R-row tile's product (rows from row0), the lanes' partial sums into part. F: the policy
// (void for Q6_K), SB its step's bytes per row.
template <class F, int R, int KW, int SB, int PD, class A>
static __device__ __forceinline__ void tile(const A& p, int row0, float (&part)[2 * R]) {
    const uint8_t* rows[2 * R];
    mvtc::row_ptrs<R>(p.w, row0, p.n_out, p.row_bytes, rows);
    const uint8_t* prow = pf_row<R>(p.w, row0, p.n_out, p.row_bytes);
    if constexpr (std::is_same_v<F, void>) {
#pragma unroll
        for (int r = 0; r < 2 * R; r++) part[r] = 0.0f;
        q6_rows<R, PD>(rows, prow, words(p), sums(p), p.n_in / 256, part);
    } else {
        const int n = p.n_in / 256;
        rows_pf<F, R, SB, PD>(rows, prow, words(p), sums(p), n, (int)(threadIdx.x >> 5), KW, part);
    }
}

// Blocks per SM the production geometry holds (the persistent loop must not take more registers).
template <int R, int KW>
constexpr int minb() {
    return KW == 8 ? (R == 1 ? 2 : 1) : 3;
}

// `L<PD>`: one tile per block, each warp's steps prefetched PD ahead (the first PD before the wait).
template <class F, int R, int KW, int SB, int PD, class A>
static __global__ void __launch_bounds__(32 * KW, minb<R, KW>()) k_loop(const A p) {
    const int row0 = blockIdx.x * 16 * R, warp = threadIdx.x >> 5, n = p.n_in / 256;
    const uint8_t* prow = pf_row<R>(p.w, row0, p.n_out, p.row_bytes);
    for (int i = warp, k = 0; i < n && k < PD; i += KW, k++) pf_step<R, SB>(prow + (size_t)i * SB);
    pf::pdl_wait();
    pf::pdl_trigger();
    float part[2 * R];
    tile<F, R, KW, SB, PD>(p, row0, part);
    mvtc::bench_store<R, KW>(part, row0, p.n_out, p.out);
}

// `P<PD>`: resident blocks looping over tiles b, b + G, ...; tile b + PD G prefetched while tile b
// computes (tiles b .. b + (PD - 1) G before the wait).
template <class F, int R, int KW, int SB, int PD, class A>
static __global__ void __launch_bounds__(32 * KW, minb<R, KW>()) k_persist(const A p) {
    const int tiles = (p.n_out + 16 * R - 1) / (16 * R), G = gridDim.x;
    auto pf_tile = [&](int t) {
        if (t < tiles) pf_range(p.w + (size_t)t * 16 * R * p.row_bytes, (size_t)min(16 * R, p.n_out - t * 16 * R) * p.row_bytes);
    };
    for (int k = 0; k < PD; k++) pf_tile((int)blockIdx.x + k * G);
    pf::pdl_wait();
    pf::pdl_trigger();
    for (int t = blockIdx.x; t < tiles; t += G) {
        pf_tile(t + PD * G);
        float part[2 * R];
        tile<F, R, KW, SB, 0>(p, t * 16 * R, part);
        mvtc::bench_store<R, KW>(part, t * 16 * R, p.n_out, p.out);
        __syncthreads();  // bench_store's shared sums read before the next tile writes them
    }
}

}  // namespace mvpf
