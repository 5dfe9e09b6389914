// norm.cu: RMSNorm (plain, fused with the residual add, gated), the per-head L2 norm of q/k, and
// the decode-shaped gate of the attention output (sigmoid_mul_rows).
//
// One block per group of d values (a token's hidden vector, or one head). Each thread strides
// over the group; the sum of squares is a block reduction. Values are computed as the CPU
// reference writes them: s = 1 / sqrt(mean(x^2) + eps), y = (x * s) * w (two roundings).
//
// Slot p6 (all three RMSNorms): when non-zero, the same outputs rounded to f16 (round to nearest,
// as pf_f32_to_f16 writes them) at the same index: the f16 copy a tensor-core product of the fast
// prefill path reads next (src/backend/cuda/shadow.rs), written here instead of by one more launch.
//
// Prepared copies (decode: rms_norm, add_rms_norm, gated_rms_norm_rows, sigmoid_mul_rows, one block
// per token row): slots p7 (Q4_K layout, matvec_tc.cuh), p5 (Q8_0, matvec_tc8.cuh), p4 (Q6_K,
// matvec_tc6.cuh), each 0 or the layout's words of all rows, then their sums or scales. The kernel
// writes each asked-for layout of its output rows, bit for bit what that format's prep kernel
// (mvtc_prep_<format>) would write, which saves each product input one prep launch
// (src/backend/cuda/ops/matvec_tc.rs `Preps` says which). One warp per 256 values and layout, no
// barrier but the one after the outputs; the Q8_0 layout needs IMG_WORDS of dynamic shared memory
// per warp. Rows that are not a multiple of 256 are not prepared.
#include "common.cuh"
#if !defined(PF_EMU)
// (dev/cuda/emu/mvtc_checks.cpp runs this file's preps only: its emulator has no atomics.)
#include "route.cuh"
#endif
#if defined(__CUDACC__) || defined(PF_EMU)
// (dev/cuda/emulate.sh's host build has no tensor-core code: it leaves the prepared slots zero;
// dev/cuda/emu/mvtc_checks.cpp runs the preps here on its emulator.)
#include "out_prep.cuh"
#endif

// The prepared copies of this block's output row (row blockIdx.x of gridDim.x, n values at
// out_row), in every layout asked for. Call after the outputs are written, from every thread.
__device__ __forceinline__ void prep_out_row(const Args& a, const float* out_row, int n) {
    // Which layouts: bit 0 Q4_K (p7), bit 1 Q8_0 (p5), bit 2 Q6_K (p4).
    const unsigned mask = (a.p[7] ? 1u : 0u) | (a.p[5] ? 2u : 0u) | (a.p[4] ? 4u : 0u);
    if (mask == 0 || n % 256 != 0) return;
#if defined(__CUDACC__) || defined(PF_EMU)
    DYNAMIC_SMEM(uint32_t, img_all);  // Q8_0: IMG_WORDS per warp
    const size_t nsb = (size_t)n / 256, rows = gridDim.x, row = blockIdx.x;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
    const int tasks = (int)nsb * __popc(mask);
    __syncthreads();  // every thread's outputs written
    for (int task = warp; task < tasks; task += warps) {
        unsigned m = mask;  // the (task / nsb)-th layout asked for
        for (int k = task / (int)nsb; k > 0; k--) m &= m - 1;
        const size_t sb = (size_t)(task % (int)nsb);
        const int layout = (m & 1u) ? 0 : (m & 2u) ? 1 : 2;  // its lowest bit
        mvtc::prep_unit_warp(layout, out_row + sb * 256, row * nsb + sb, rows * nsb, a.p[7], a.p[5], a.p[4],
                             img_all + warp * mvtc8::IMG_WORDS);
    }
#else
    (void)out_row;
#endif
}

// ---------------------------------------------------------------------------------------------
// Decode-shaped producers over slices of 256 (grid (n / 256, token rows), 256 threads: thread i
// owns value 256 blockIdx.x + i of row blockIdx.y). A whole row on one SM (the kernels above) is a
// long serial step of the decode chain, and a separate prep launch per product input is one more
// step: here the row is spread over n / 256 SMs and every block prepares its own slice (one
// super-block, or Q8_0 group) for the products, warp 0 in the Q4_K layout, warp 1 Q8_0, warp 2
// Q6_K, bit for bit what mvtc_prep_<format> writes.

// The prepared copies of this block's slice (super-block blockIdx.x of row blockIdx.y of an output
// of rows of n): `v` is this thread's output value; the slice goes through shared memory (the
// preparing warps read it there, not back from L2). Call from every thread of the 256.
__device__ __forceinline__ void prep_slice(const Args& a, float v, int n) {
#if defined(__CUDACC__) || defined(PF_EMU)
    const size_t nsb = (size_t)n / 256;
    mvtc::prep_slice_block(v, (size_t)blockIdx.y * nsb + blockIdx.x, (size_t)gridDim.y * nsb, a.p[7], a.p[5], a.p[4]);
#else
    (void)a, (void)v, (void)n;
#endif
}

// The blocks of one launch meet here (all of them are resident: the host launches at most one
// block per SM, src/backend/cuda/ops/norm.rs `slices_fit`, and under dependent launch the next
// kernel is scheduled only once every block of this one has started). `bar` is one 64-bit word,
// zero before the first launch: arrivals in the low half, the generation in the high half. A
// block's arrival returns the generation it waits to see change; the last to arrive resets the
// count and opens the next generation in one atomic (count nb + 2^32 - nb carries into the high
// half). One atomic round trip per block and one more for the last: an arrival count and a
// generation word in two words took a read, an exchange and an add in series. Memory written
// before the barrier by any block is visible to every block after it (read it with __ldcg: L1 is
// not coherent).
__device__ __forceinline__ void grid_barrier(unsigned long long* bar) {
#if defined(__CUDACC__)
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned nb = gridDim.x * gridDim.y * gridDim.z;
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
    (void)bar;
#endif
}

// A float another block wrote before a grid_barrier (from L2: this SM's L1 may hold a stale line).
__device__ __forceinline__ float load_l2(const float* p) {
#if defined(__CUDACC__)
    return __ldcg(p);
#else
    return *reinterpret_cast<const volatile float*>(p);
#endif
}

// Four floats another kernel wrote (16-byte aligned), from L2 (as load_l2).
__device__ __forceinline__ float4 load_l2_4(const float* p) {
#if defined(__CUDACC__)
    return __ldcg(reinterpret_cast<const float4*>(p));
#else
    const volatile float* v = p;
    return float4{v[0], v[1], v[2], v[3]};
#endif
}

// acc += x; out = rms_norm(acc; w), over slices: each block adds and squares its slice, writes the
// slice's sum of squares, and after a grid barrier (the add is in place: another block's slice is
// not final before it) sums the row's partial sums in one fixed order (every block gets the same
// scale), normalizes its slice and prepares it. A norm without the add takes rms_norm_slices_whole.
// Slots: p0 acc, p1 x, p2 w, p3 out, p4 p5 p7 prepared out or 0; n0 d (a multiple of 256, at most
// 256 * 32), n2 the sync scratch (barrier words, then partial sums); f0 eps.
KERNEL void __launch_bounds__(256) rms_norm_slices(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int d = (int)a.n[0], nsl = gridDim.x;
    const size_t o = (size_t)blockIdx.y * d;
    const int i = blockIdx.x * 256 + threadIdx.x;
    float* acc = reinterpret_cast<float*>(a.p[0]) + o;
    const float* x = reinterpret_cast<const float*>(a.p[1]) + o;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + o;
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(a.n[2]);
    float* part = reinterpret_cast<float*>(bar + 16) + (size_t)blockIdx.y * nsl;  // 128 bytes on
    const float v = acc[i] + x[i];
    acc[i] = v;
    const float ss = block_sum(v * v, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = ss;
    grid_barrier(bar);
    if (threadIdx.x < 32) {
        const float p = threadIdx.x < (unsigned)nsl ? load_l2(part + threadIdx.x) : 0.0f;
        const float tot = warp_sum(p);
        if (threadIdx.x == 0) sh[0] = 1.0f / sqrtf(tot / (float)d + a.f[0]);
    }
    __syncthreads();
    const float y = __fmul_rn(__fmul_rn(v, sh[0]), w[i]);
    out[i] = y;
    prep_slice(a, y, d);
}

// out = rms_norm(acc; w) over slices, with no grid barrier: every block reads the whole row from
// L2 and sums its squares in one fixed order (every block gets the same scale), then normalizes
// its slice and prepares it. For a row nobody writes while the blocks read it: the residual stream
// after `matmul_add_rms_norm`'s product has added its rows into it (so there is no add here, and
// no in-place write that another block could read half-done). Slots: p0 acc, p2 w, p3 out, p4 p5
// p7 prepared out or 0; n0 d (a multiple of 256); f0 eps.
KERNEL void __launch_bounds__(256) rms_norm_slices_whole(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int d = (int)a.n[0];
    const size_t o = (size_t)blockIdx.y * d;
    const float* acc = reinterpret_cast<const float*>(a.p[0]) + o;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + o;
    // Thread t: elements 4t.. 4t+3, then 1024 further on, ...: 16-byte loads all in flight at once.
    float ss = 0.0f;
    for (int j = 4 * (int)threadIdx.x; j < d; j += 1024) {
        const float4 v = load_l2_4(acc + j);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss, sh);
    const float s = 1.0f / sqrtf(ss / (float)d + a.f[0]);
    const int i = blockIdx.x * 256 + threadIdx.x;
    const float y = __fmul_rn(__fmul_rn(load_l2(acc + i), s), w[i]);
    out[i] = y;
    prep_slice(a, y, d);
}

// A MoE layer's FFN input for one token (Backend::moe_ffn): acc += y, out = rms_norm(acc; w) (and
// its prepared copies), the router's logits of out and the shared expert's gate logit, and the
// routing (route.cuh), in one launch. Blocks 0 .. d/256-1 normalize and prepare a slice of out each
// (as rms_norm_slices_whole); the others compute 8 router rows each (one warp a row, its first
// NR_PRE * 128 weights loaded before the dependency wait: weights are written by no kernel; row E is
// the shared expert's gate) on their own copy of out in shared memory. Every block sums the squares
// of the whole row acc + y in one fixed order (every block the same scale, and out the same bits in
// every block) and keeps its share of acc + y in registers; acc is written only by the last block
// to count itself done (nobody reads it any more), from those registers, and that block routes the
// logits (the others wrote them before they counted). Slots: p0 acc, p1 y, p2 w, p3 out, p4 p5 p7
// prepared out or 0, p6 router [E, d]; n0 d (a multiple of 256, at most 256 * 4 * NR_V), n1 E (<= 256
// * ROUTE_PER_THREAD), n2 k, n3 shared gate weight [d], n4 logits [E], n5 shared gate logit [1], n6
// ids (u32 [k]), n7 weights [k], n8 the counter (u32, zero between launches); f0 eps, f1 the
// weights' scale. Grid: d / 256 + ceil((E + 1) / 8) blocks of 256; dynamic shared memory d floats.
#if !defined(PF_EMU)
#define NR_PRE 16  // router weights per lane in registers: rows of up to 2048 entirely
#define NR_V 8     // float4s of acc + y per thread: rows of up to 8192
KERNEL void __launch_bounds__(256) moe_norm_route(const Args a) {
    __shared__ RouteSmem sm;
    __shared__ bool last;
    DYNAMIC_SMEM(float, xs);
    const int d = (int)a.n[0], E = (int)a.n[1], nsl = d / 256, tid = threadIdx.x, lane = tid % 32;
    const int row = ((int)blockIdx.x - nsl) * 8 + tid / 32;
    const bool router = (int)blockIdx.x >= nsl && row <= E;
    const float* wr = !router ? nullptr
                      : row < E ? reinterpret_cast<const float*>(a.p[6]) + (size_t)row * d
                                : reinterpret_cast<const float*>(a.n[3]);
    float4 wv[NR_PRE];
#pragma unroll
    for (int q = 0; q < NR_PRE; q++) {
        const int j = 4 * lane + 128 * q;
        wv[q] = router && j < d ? __ldg(reinterpret_cast<const float4*>(wr + j)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    kernel_start();
    float* acc = reinterpret_cast<float*>(a.p[0]);
    const float* y = reinterpret_cast<const float*>(a.p[1]);
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    // Thread t: elements 4t .. 4t + 3, then 1024 further on, ...: all loads in flight at once.
    float4 v[NR_V];
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < NR_V; q++) {
        const int j = 4 * tid + 1024 * q;
        if (j < d) {
            const float4 h = load_l2_4(acc + j), u = load_l2_4(y + j);
            v[q] = make_float4(h.x + u.x, h.y + u.y, h.z + u.z, h.w + u.w);
            ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
            *reinterpret_cast<float4*>(xs + j) = v[q];
        }
    }
    ss = block_sum(ss, sm.sh);  // (its barriers also publish xs)
    const float s = 1.0f / sqrtf(ss / (float)d + a.f[0]);
    if ((int)blockIdx.x < nsl) {
        const int i = blockIdx.x * 256 + tid;
        const float o = __fmul_rn(__fmul_rn(xs[i], s), w[i]);
        reinterpret_cast<float*>(a.p[3])[i] = o;
        prep_slice(a, o, d);
    } else {
        for (int j = tid; j < d; j += 256) xs[j] = __fmul_rn(__fmul_rn(xs[j], s), w[j]);
        __syncthreads();
        if (router) {
            float dot = 0.0f;
#pragma unroll
            for (int q = 0; q < NR_PRE; q++) {
                const int j = 4 * lane + 128 * q;
                if (j < d) dot += wv[q].x * xs[j] + wv[q].y * xs[j + 1] + wv[q].z * xs[j + 2] + wv[q].w * xs[j + 3];
            }
            for (int j = 4 * lane + 128 * NR_PRE; j < d; j += 128) {
                const float4 u = __ldg(reinterpret_cast<const float4*>(wr + j));
                dot += u.x * xs[j] + u.y * xs[j + 1] + u.z * xs[j + 2] + u.w * xs[j + 3];
            }
            dot = warp_sum(dot);
            if (lane == 0) reinterpret_cast<float*>(row < E ? a.n[4] + 4ull * row : a.n[5])[0] = dot;
        }
    }
    // Count this block done (its reads of acc over, its logits written); the last one finishes.
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        last = atomicAdd(reinterpret_cast<unsigned*>(a.n[8]), 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int q = 0; q < NR_V; q++) {
        const int j = 4 * tid + 1024 * q;
        if (j < d) *reinterpret_cast<float4*>(acc + j) = v[q];
    }
    route_rank_block(reinterpret_cast<const float*>(a.n[4]), E, (int)a.n[2], a.f[1],
                     reinterpret_cast<uint32_t*>(a.n[6]), reinterpret_cast<float*>(a.n[7]), sm);
    if (tid == 0) *reinterpret_cast<unsigned*>(a.n[8]) = 0u;  // for the next launch
}
#endif

// gated_rms_norm over slices: groups of d values (d divides 256, a multiple of 32: 256 / d groups
// per block, d / 32 warps each), out = rms_norm(x; w) * silu(z). Slots: p0 x, p1 z, p2 w [d], p3 out,
// p4 p5 p7 prepared out or 0; n0 d, n1 n; f0 eps.
KERNEL void __launch_bounds__(256) gated_rms_norm_slices(const Args a) {
    kernel_start();
    __shared__ float sh[8];
    const int d = (int)a.n[0], n = (int)a.n[1];
    const size_t o = (size_t)blockIdx.y * n;
    const int i = blockIdx.x * 256 + threadIdx.x;
    const float* x = reinterpret_cast<const float*>(a.p[0]) + o;
    const float* z = reinterpret_cast<const float*>(a.p[1]) + o;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + o;
    const float y = gated_norm_in_slice(x[i], w[i % d], z[i], d, a.f[0], sh);
    out[i] = y;
    prep_slice(a, y, n);
}

// x *= sigmoid(gate) over slices (the values of elementwise.cu's sigmoid_mul_assign), in place,
// then the slice prepared for the attention output projection. Slots: p0 x, p1 gate, p4 p5 p7
// prepared x or 0; n1 n.
KERNEL void __launch_bounds__(256) sigmoid_mul_slices(const Args a) {
    kernel_start();
    const int n = (int)a.n[1];
    const size_t o = (size_t)blockIdx.y * n;
    const int i = blockIdx.x * 256 + threadIdx.x;
    float* x = reinterpret_cast<float*>(a.p[0]) + o;
    const float* g = reinterpret_cast<const float*>(a.p[1]) + o;
    const float y = x[i] * sigmoidf_(g[i]);
    x[i] = y;
    prep_slice(a, y, n);
}

// out[i] = v, and the f16 copy when there is one.
__device__ __forceinline__ void put(float* out, __half* out16, size_t i, float v) {
    out[i] = v;
    if (out16 != nullptr) out16[i] = __float2half_rn(v);
}

// out = rms_norm(x; w). Slots: p0 x, p1 w [d], p2 out, p6 f16 out or 0, p4 p5 p7 prepared out or 0
// (decode); n0 d; f0 eps. Grid: groups.
KERNEL void __launch_bounds__(1024) rms_norm(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int d = (int)a.n[0];
    const float* x = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.x * d;
    const float* w = reinterpret_cast<const float*>(a.p[1]);
    float* out = reinterpret_cast<float*>(a.p[2]) + (size_t)blockIdx.x * d;
    __half* out16 = a.p[6] ? reinterpret_cast<__half*>(a.p[6]) + (size_t)blockIdx.x * d : nullptr;
    const float s = rms_scale(x, d, a.f[0], sh);
    for (int i = threadIdx.x; i < d; i += blockDim.x) put(out, out16, i, __fmul_rn(__fmul_rn(x[i], s), w[i]));
    prep_out_row(a, out, d);
}

// acc += x; out = rms_norm(acc; w). Slots: p0 acc, p1 x, p2 w, p3 out, p6 f16 out or 0, p4 p5 p7
// prepared out or 0 (decode); n0 d; f0 eps.
KERNEL void __launch_bounds__(1024) add_rms_norm(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int d = (int)a.n[0];
    float* acc = reinterpret_cast<float*>(a.p[0]) + (size_t)blockIdx.x * d;
    const float* x = reinterpret_cast<const float*>(a.p[1]) + (size_t)blockIdx.x * d;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + (size_t)blockIdx.x * d;
    __half* out16 = a.p[6] ? reinterpret_cast<__half*>(a.p[6]) + (size_t)blockIdx.x * d : nullptr;
    // Each thread adds and later reads back only its own elements: no barrier needed between.
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc[i] = acc[i] + x[i];
    const float s = rms_scale(acc, d, a.f[0], sh);
    for (int i = threadIdx.x; i < d; i += blockDim.x) put(out, out16, i, __fmul_rn(__fmul_rn(acc[i], s), w[i]));
    prep_out_row(a, out, d);
}

// out = rms_norm(x; w) * silu(z). Slots: p0 x, p1 z, p2 w [d], p3 out, p6 f16 out or 0; n0 d;
// f0 eps.
KERNEL void gated_rms_norm(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int d = (int)a.n[0];
    const size_t o = (size_t)blockIdx.x * d;
    const float* x = reinterpret_cast<const float*>(a.p[0]) + o;
    const float* z = reinterpret_cast<const float*>(a.p[1]) + o;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + o;
    __half* out16 = a.p[6] ? reinterpret_cast<__half*>(a.p[6]) + o : nullptr;
    const float s = rms_scale(x, d, a.f[0], sh);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        put(out, out16, i, __fmul_rn(__fmul_rn(__fmul_rn(x[i], s), w[i]), siluf_(z[i])));
}

// gated_rms_norm in the decode shape: one block per token row of n values (n / d groups), warp w
// normalizing groups w, w + warps, ... (a warp's lanes stride over the group: no block reduction,
// one barrier per row, before the prepared copies). Slots: p0 x, p1 z, p2 w [d], p3 out, p4 p5 p7
// prepared out or 0; n0 d, n1 n; f0 eps. Grid: tokens.
KERNEL void __launch_bounds__(1024) gated_rms_norm_rows(const Args a) {
    kernel_start();
    const int d = (int)a.n[0], n = (int)a.n[1];
    const size_t o = (size_t)blockIdx.x * n;
    const float* x = reinterpret_cast<const float*>(a.p[0]) + o;
    const float* z = reinterpret_cast<const float*>(a.p[1]) + o;
    const float* w = reinterpret_cast<const float*>(a.p[2]);
    float* out = reinterpret_cast<float*>(a.p[3]) + o;
    const int l = threadIdx.x & 31;
    for (int g = threadIdx.x / 32; g < n / d; g += blockDim.x / 32) {
        const float* xg = x + (size_t)g * d;
        float ss = 0.0f;
        for (int i = l; i < d; i += 32) ss = fmaf(xg[i], xg[i], ss);
        const float s = 1.0f / sqrtf(warp_sum(ss) / (float)d + a.f[0]);
        for (int i = l; i < d; i += 32)
            out[(size_t)g * d + i] = __fmul_rn(__fmul_rn(__fmul_rn(xg[i], s), w[i]), siluf_(z[(size_t)g * d + i]));
    }
    prep_out_row(a, out, n);
}

// x *= sigmoid(gate) (elementwise.cu sigmoid_mul_assign, the same values) in the decode shape: one
// block per token row of n values, so that the block can prepare the row for the attention
// output projection; in place, so the copies are made of the final values, after the barrier.
// Slots: p0 x, p1 gate, p4 p5 p7 prepared x or 0; n1 n. Grid: tokens.
KERNEL void __launch_bounds__(1024) sigmoid_mul_rows(const Args a) {
    kernel_start();
    const int n = (int)a.n[1];
    float* x = reinterpret_cast<float*>(a.p[0]) + (size_t)blockIdx.x * n;
    const float* g = reinterpret_cast<const float*>(a.p[1]) + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * sigmoidf_(g[i]);
    prep_out_row(a, x, n);
}

// In place on u [T, conv_dim]: every q and k head (the first 2*hk groups of dk of a row) times
// 1/sqrt(sum(x^2) + eps), q heads also times 1/sqrt(dk). Slots: p0 u; n0 conv_dim, n1 hk, n2 dk;
// f0 eps. Grid: (2*hk, T).
KERNEL void l2_norm_qk(const Args a) {
    kernel_start();
    __shared__ float sh[32];
    const int cd = (int)a.n[0], hk = (int)a.n[1], dk = (int)a.n[2];
    const int h = blockIdx.x;
    float* x = reinterpret_cast<float*>(a.p[0]) + (size_t)blockIdx.y * cd + (size_t)h * dk;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, sh);
    float s = 1.0f / sqrtf(ss + a.f[0]);
    if (h < hk) s *= 1.0f / sqrtf((float)dk);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) x[i] = x[i] * s;
}
