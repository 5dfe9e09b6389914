// dev/cuda/matvec_warp.cuh (a candidate layout, timed by matvec_bench.cu): the one-token
// matrix-vector product (decode), one warp per R weight rows, for the scaled-integer formats
// (formats.cuh QFmt: Q4_0 .. Q8_0, Q2_K .. Q6_K).
//
//   out[o] = sum_i W[o][i] * x[i]            (GLU: out[o] = silu(W[o] . x) * (W2[o] . x))
//
// Why a second layout next to matvec.cuh's blocks: for one token the time is the weight bytes
// read, and a product at layer size (2-30 MB) only reaches the card's bandwidth if every SM keeps
// many independent 16-byte loads in flight from its first cycle. matvec.cuh stages the whole
// activation vector in shared memory per block (a prologue as long as a small block's share of
// the weights, then a barrier) and decodes one row at a time. Here:
//   * lane l of a warp takes units l, l + 32, ... of its R rows (a warp reads 32 consecutive units
//     of a row: contiguous bytes);
//   * per unit, the loads of all R rows are issued before any arithmetic (F::load into registers,
//     then F::dot_loaded), so R x (one unit's bytes) are in flight per lane;
//   * the unit's 32 activations come straight from global memory (eight 16-byte loads that hit
//     L1: every warp of the SM reads the same small vector), reused for the R rows; no shared
//     memory and no barrier;
//   * before waiting for the previous kernel (programmatic dependent launch) each lane asks L2 for
//     its rows' lines: weights are never written by a kernel, so this overlaps the previous
//     kernel's tail;
//   * the R sums are reduced with warp shuffles in a fixed order (reproducible).
// Precision: f32 arithmetic on exactly dequantized weights (the strict tier), the same per-unit
// products as matvec.cuh summed in another order.
//
// Requirements (checked by the host): n_in % 32 == 0 for 32-element formats, % 256 for K-quants
// (whole blocks per row, as the format implies); x 16-byte aligned.
#pragma once

#include "formats.cuh"

#define MVW_THREADS 128  // four warps per block: small blocks spread a small matrix over every SM

template <int R>
__device__ __forceinline__ void mvw_prefetch(const uint8_t* W, int row0, int n_out, size_t row_bytes) {
    const int lane = threadIdx.x & 31;
    const int rows = min(R, n_out - row0);
    const size_t bytes = (size_t)rows * row_bytes;
    const uint8_t* base = W + (size_t)row0 * row_bytes;
    for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128) prefetch_l2(base + off);
}

// The 32 activations of unit u (x 16-byte aligned) and the sums of their two halves.
__device__ __forceinline__ void mvw_load_x(const float* X, int u, float (&xr)[32], float2& sx) {
    const float4* p = reinterpret_cast<const float4*>(X + 32 * (size_t)u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 v = __ldg(p + i);
        xr[4 * i] = v.x;
        xr[4 * i + 1] = v.y;
        xr[4 * i + 2] = v.z;
        xr[4 * i + 3] = v.w;
    }
    sx = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        sx.x += xr[i];
        sx.y += xr[16 + i];
    }
}

template <class F, int R, bool GLU>
__device__ __forceinline__ void matvec_warp(const uint8_t* W, const uint8_t* W2, const float* X, float* out, int n_out,
                                            int n_in, size_t row_bytes) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (MVW_THREADS / 32) + threadIdx.x / 32) * R;
    if (row0 < n_out) {
        mvw_prefetch<R>(W, row0, n_out, row_bytes);
        if (GLU) mvw_prefetch<R>(W2, row0, n_out, row_bytes);
    }
    kernel_start();
    if (row0 >= n_out) return;  // uniform over the warp

    // Rows past the end repeat the last row (loads stay in bounds; their sums are not stored).
    const uint8_t* rows[R];
    const uint8_t* rows2[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const size_t off = (size_t)min(row0 + r, n_out - 1) * row_bytes;
        rows[r] = W + off;
        rows2[r] = GLU ? W2 + off : nullptr;
    }
    float acc[R], accu[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = accu[r] = 0.0f;

    const int units = n_in / 32;
    for (int u = lane; u < units; u += 32) {
        const size_t bo = (size_t)(u / F::UNITS) * F::BYTES;
        const int sub = u % F::UNITS;
        uint32_t q[R][8], q2[GLU ? R : 1][8];
        Scales s[R], s2[GLU ? R : 1];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            F::load(rows[r] + bo, sub, q[r], s[r]);
            if constexpr (GLU) F::load(rows2[r] + bo, sub, q2[r], s2[r]);
        }
        float xr[32];
        float2 sx;
        mvw_load_x(X, u, xr, sx);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] += F::dot_loaded(q[r], s[r], xr, sx);
            if constexpr (GLU) accu[r] += F::dot_loaded(q2[r], s2[r], xr, sx);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float g = warp_sum(acc[r]);
        const float v = GLU ? warp_sum(accu[r]) : 0.0f;
        if (lane == 0 && row0 + r < n_out) out[row0 + r] = GLU ? siluf_(g) * v : g;
    }
}

// Q4_K with one lane per 32 bytes of quants: units 2c and 2c+1 of a super-block share the bytes
// qs[32c .. 32c+32] (low and high nibbles), so a lane that takes both reads each byte once.
template <int R>
__device__ __forceinline__ void matvec_warp_q4k_pair(const uint8_t* W, const float* X, float* out, int n_out,
                                                     int n_in, size_t row_bytes) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (MVW_THREADS / 32) + threadIdx.x / 32) * R;
    if (row0 < n_out) mvw_prefetch<R>(W, row0, n_out, row_bytes);
    kernel_start();
    if (row0 >= n_out) return;
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = W + (size_t)min(row0 + r, n_out - 1) * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;

    const int pairs = n_in / 64;
    for (int p = lane; p < pairs; p += 32) {
        const size_t bo = (size_t)(p / 4) * FmtQ4_K::BYTES;
        const int c = p % 4;
        uint32_t head[R][4], w[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            ld_aligned<4>(rows[r] + bo, head[r]);
            ld_aligned<8>(rows[r] + bo + 16 + 32 * c, w[r]);
        }
        float xa[32], xb[32];
        float2 sa, sb;
        mvw_load_x(X, 2 * p, xa, sa);
        mvw_load_x(X, 2 * p + 1, xb, sb);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            uint32_t lo[8], hi[8];
            mask_words(w[r], 0, 0x0F0F0F0Fu, lo);
            mask_words(w[r], 4, 0x0F0F0F0Fu, hi);
            acc[r] += FmtQ4_K::dot_loaded(lo, k4_scales(head[r], 2 * c), xa, sa);
            acc[r] += FmtQ4_K::dot_loaded(hi, k4_scales(head[r], 2 * c + 1), xb, sb);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float g = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < n_out) out[row0 + r] = g;
    }
}
