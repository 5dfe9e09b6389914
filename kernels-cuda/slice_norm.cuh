// slice_norm.cuh: the decode RMSNorm (with its residual add) of one slice of 256 values of a token
// row: the body of norm.cu's `rms_norm_slices` (a launch of its own, one block per slice) and of the
// products that take the norm of their own output as their tail (out_prep.cuh `add_norm_tail`: the
// last block of each slice of a product's output runs it, src/backend/cuda/ops/norm.rs says when).
// One body, so that a decode step replayed as a CUDA graph (where the products take the norm) and
// the same ops run one by one (where rms_norm_slices does) give the same bits.
#pragma once

#include "common.cuh"

// The blocks that meet here (`nb` of them) are all resident: the host asks for at most one per SM
// (src/backend/cuda/ops/norm.rs), and under dependent launch the next kernel is scheduled only once
// every block of this one has started. `bar` is one 64-bit word, zero before the first launch:
// arrivals in the low half, the generation in the high half. A block's arrival returns the
// generation it waits to see change; the last to arrive resets the count and opens the next
// generation in one atomic (count nb + 2^32 - nb carries into the high half). One atomic round trip
// per block and one more for the last: an arrival count and a generation word in two words took a
// read, an exchange and an add in series. Memory written before the barrier by any block is
// visible to every block after it (read it with __ldcg: L1 is not coherent).
__device__ __forceinline__ void grid_barrier(unsigned long long* bar, unsigned nb) {
#if defined(__CUDACC__)
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this block's writes before its arrival
        const unsigned long long old = atomicAdd(bar, 1ull);
        if ((unsigned)old == nb - 1) {
            atomicAdd(bar, (1ull << 32) - nb);
        } else {
            const unsigned g = (unsigned)(old >> 32);
            const volatile unsigned* gen = reinterpret_cast<const volatile unsigned*>(bar) + 1;  // high half
            while (*gen == g) __nanosleep(20);
        }
        __threadfence();
    }
    __syncthreads();
#else
    (void)bar, (void)nb;
#endif
}

// A float another block wrote (from L2: this SM's L1 may hold a stale line).
__device__ __forceinline__ float load_l2(const float* p) {
#if defined(__CUDACC__)
    return __ldcg(p);
#else
    return *reinterpret_cast<const volatile float*>(p);
#endif
}

// acc += x (x == nullptr: no add) on slice sb of row `row` (rows of d values), then out =
// rms_norm(acc; w) on that slice: the slice's sum of squares goes to the partial sums after the
// barrier word (128 bytes on, as src/backend/cuda/mod.rs lays out the sync scratch), the `nb`
// blocks (one per slice of every row) meet at the barrier, and each sums its row's partial sums in
// one fixed order. Leaves the normalized values in ys (shared, 256 floats) for the caller's
// prepared copies. Called by every thread of a block of 128 or 256 threads; the sums are taken in
// one order whatever the block size (8 warp sums of 32 squares, then their sum in one warp), and
// the values as the CPU reference writes them: s = 1 / sqrt(mean + eps), y = (x * s) * w.
__device__ __forceinline__ void slice_rms_norm(float* acc, const float* x, const float* w, float* out, int d, int row,
                                               int sb, float eps, unsigned long long* bar, unsigned nb, float* ys) {
    __shared__ float sh[8];
    __shared__ float scale;
    const int nsl = d / 256, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t o = (size_t)row * d + (size_t)sb * 256;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        float v = load_l2(acc + o + i);
        if (x != nullptr) {
            v = v + load_l2(x + o + i);
            acc[o + i] = v;
        }
        ys[i] = v;
    }
    __syncthreads();
    for (int vw = warp; vw < 8; vw += blockDim.x >> 5) {
        const float v = ys[32 * vw + lane];
        const float s = warp_sum(__fmul_rn(v, v));
        if (lane == 0) sh[vw] = s;
    }
    __syncthreads();
    float* part = reinterpret_cast<float*>(bar + 16) + (size_t)row * nsl;
    if (warp == 0) {
        const float ss = warp_sum(lane < 8 ? sh[lane] : 0.0f);
        if (lane == 0) part[sb] = ss;
    }
    grid_barrier(bar, nb);
    if (warp == 0) {
        const float tot = warp_sum(lane < nsl ? load_l2(part + lane) : 0.0f);
        if (lane == 0) scale = 1.0f / sqrtf(tot / (float)d + eps);
    }
    __syncthreads();
    const float s = scale;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const float y = __fmul_rn(__fmul_rn(ys[i], s), w[sb * 256 + i]);
        out[o + i] = y;
        ys[i] = y;
    }
    __syncthreads();
}
