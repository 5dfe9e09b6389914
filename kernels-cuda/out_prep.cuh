// out_prep.cuh: a product kernel's output prepared for the next tensor-core product by the
// product's own blocks, so that no prep launch (mvtc_prep_<format>) follows it in decode.
//
// The fused SwiGLU (matvec_tc*.cu `mvtc_glu_*`, and a MoE layer's `mvtc_glu_sh_*` for its hidden
// rows) writes the down product's input, 16 rows per block: a slice of 256 outputs (one
// super-block, or one Q8_0 group) is complete when its 16 blocks have written it. Each block
// counts itself in the slice's counter after its stores; the last one prepares the slice (one
// warp per layout, as norm.cu's producers do) and resets the counter for the next launch. Slots
// (read only when n10 is non-zero): n7 Q4_K layout, n8 Q8_0, n9 Q6_K (each 0 or the layout's
// words of every output vector, then their sums or scales, as norm.cu's p7 / p5 / p4), n10 the
// counters (one u32 per (vector, slice), zero between launches). The output rows must be whole
// slices (the host asks only then).
#pragma once

#include "matvec_tc6.cuh"

namespace mvtc {

// One warp prepares the 256 values at x, unit u of `units` (every output row's slices), in layout
// `layout`: 0 Q4_K into q4k, 1 Q8_0 into q80 (img: the warp's shared image, mvtc8::IMG_WORDS),
// 2 Q6_K into q6k; each pointer 0 (skipped) or the layout's words of all units, then their sums
// or scales. Every producer that prepares its own output goes through here (norm.cu, the SwiGLU
// below).
static __device__ __forceinline__ void prep_unit_warp(int layout, const float* x, size_t u, size_t units,
                                                      unsigned long long q4k, unsigned long long q80,
                                                      unsigned long long q6k, uint32_t* img) {
    if (layout == 0 && q4k) {
        uint32_t* xa = reinterpret_cast<uint32_t*>(q4k);
        prep_sb_warp(x, xa + u * SB_WORDS, reinterpret_cast<float*>(xa + units * SB_WORDS) + u * SB_SUMS);
    } else if (layout == 1 && q80) {
        uint32_t* xb = reinterpret_cast<uint32_t*>(q80);
        mvtc8::prep_grp_warp(x, xb + u * mvtc8::G_WORDS,
                             reinterpret_cast<float*>(xb + units * mvtc8::G_WORDS) + u * mvtc8::G_FACT, img);
    } else if (layout == 2 && q6k) {
        uint32_t* xb = reinterpret_cast<uint32_t*>(q6k);
        mvtc6::prep_sb_warp(x, xb + u * mvtc6::SB_WORDS, reinterpret_cast<float*>(xb + units * mvtc6::SB_WORDS) + u);
    }
}

// A block of 256 threads prepares the slice of 256 values it holds (thread i: value i, `v`), unit u of
// `units`, in every layout given (pointers as prep_unit_warp's): the slice through shared memory,
// warp w prepares layout w. norm.cu's slice kernels and gdn_step.cu's tail.
static __device__ __forceinline__ void prep_slice_block(float v, size_t u, size_t units, unsigned long long q4k,
                                                        unsigned long long q80, unsigned long long q6k) {
    __shared__ __align__(32) float ys[256];  // the Q8_0 prep reads it as float4 (matvec_tc8.cuh ld8)
    __shared__ uint32_t img[mvtc8::IMG_WORDS];
    ys[threadIdx.x] = v;
    __syncthreads();
    prep_unit_warp(threadIdx.x / 32, ys, u, units, q4k, q80, q6k, img);
}

// Call from every thread of a GLU block after mv_body: ROWS output rows per block, vector
// blockIdx.y at out + blockIdx.y * n_out (segment 0 of the table).
template <int ROWS>
static __device__ __forceinline__ void glu_out_prep(const ::Args& a) {
    static_assert(256 % ROWS == 0, "a block's rows lie in one slice");
    if (a.n[10] == 0) return;
#if !defined(PF_EMU)
    __shared__ __align__(32) float xs[256];  // the Q8_0 prep reads it as float4 (matvec_tc8.cuh ld8)
    __shared__ uint32_t img[mvtc8::IMG_WORDS];
    __shared__ int last;
    const int n_out = a.seg[0].rows, nsb = n_out / 256;
    const int row0 = (int)blockIdx.x * ROWS, sb = row0 / 256;
    const float* out_v = reinterpret_cast<const float*>(a.seg[0].out) + (size_t)blockIdx.y * n_out;
    unsigned* cnt = reinterpret_cast<unsigned*>(a.n[10]) + (size_t)blockIdx.y * nsb + sb;
    __threadfence();  // this thread's outputs (if any) visible on the GPU before the count
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned old = atomicAdd(cnt, 1u);
        last = old == 256 / ROWS - 1;
        if (last) {
            atomicExch(cnt, 0u);  // every block of the slice has counted: ready for the next launch
            __threadfence();
        }
    }
    __syncthreads();
    if (!last) return;
    // Other blocks' outputs: from L2 (this SM's L1 may hold none of them, but never trust it).
    for (int i = threadIdx.x; i < 256; i += blockDim.x) xs[i] = __ldcg(out_v + (size_t)sb * 256 + i);
    __syncthreads();
    // Warp w prepares layout w.
    prep_unit_warp(threadIdx.x / 32, xs, (size_t)blockIdx.y * nsb + sb, (size_t)gridDim.y * nsb, a.n[7], a.n[8],
                   a.n[9], img);
#endif
}

}  // namespace mvtc
