// mvtc_pipe.cuh: the tensor-core products (Q4_K, Q8_0) with and without weight loads in flight
// during the arithmetic, for dev/cuda/matvec_bench.cu (variants `tcT`, `tcD`).
//
// The production loop of F::rows issues one step's weight loads (a Q4_K super-block, a Q8_0 group
// of 8 blocks), then its arithmetic: a warp has one step in flight at a time, and none while it
// computes. `D` (matvec_tc.cuh rows_db) loads the next step's weights into registers before this
// step's arithmetic and the first step before the dependent-launch wait (weights are written by no
// kernel); `T` is the production loop. Both let the next kernel be scheduled after the wait, as
// the backend's kernels do (kernel_start). A warp-private cp.async ring of 2-4 stages was also
// timed and lost everywhere (dev/cuda/DECISIONS.md, tensor cores).
#pragma once

#include "matvec_tc.cuh"
#include "matvec_tc8.cuh"

namespace mvpipe {

// The prepared x of each format's harness Args (mvtc::Args: xa, xs; mvtc8::Args: xb, xf).
static __device__ __forceinline__ const uint32_t* words(const mvtc::Args& p) { return p.xa; }
static __device__ __forceinline__ const float* sums(const mvtc::Args& p) { return p.xs; }
static __device__ __forceinline__ const uint32_t* words(const mvtc8::Args& p) { return p.xb; }
static __device__ __forceinline__ const float* sums(const mvtc8::Args& p) { return p.xf; }

// One product, out = W x, on KW warps of 16R rows: F the production policy (mvtc::TcQ4K,
// mvtc8::TcQ80), DB the double buffer.
template <class F, int R, int KW, bool DB, class A>
static __device__ __forceinline__ void body(const A& p) {
    const int row0 = blockIdx.x * 16 * R, n = p.n_in / 256, warp = threadIdx.x >> 5;
    const uint8_t* rows[2 * R];
    mvtc::row_ptrs<R>(p.w, row0, p.n_out, p.row_bytes, rows);
    typename F::template W<R> first;
    if (DB && warp < n) F::template load<R>(rows, warp, first);
    pf::pdl_wait();
    pf::pdl_trigger();
    float part[2 * R];
    if (DB)
        mvtc::rows_db<F, R>(rows, words(p), sums(p), n, warp, KW, part, first, warp < n, rows, false);
    else
        F::template rows<R, KW>(rows, words(p), sums(p), n, warp, KW, part);
    mvtc::bench_store<R, KW>(part, row0, p.n_out, p.out);
}

template <class F, int R, int KW, bool DB, class A>
static __global__ void __launch_bounds__(32 * KW) k(const A p) {
    body<F, R, KW, DB>(p);
}

}  // namespace mvpipe
