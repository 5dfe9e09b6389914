// common.cuh: what every kernel file shares. The parameter block, warp/block reductions,
// programmatic dependent launch, exact small-integer-to-float conversions and unaligned loads.
//
// Conventions (llm.c style): one `extern "C" __global__` entry point per kernel variant, plain
// loops, a comment on every non-obvious index. All arithmetic is IEEE f32 (no fast math): the
// default path is the strict precision tier and is tested against the CPU reference backend.
#pragma once

#include <stdint.h>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

// One parameter block for every kernel. The host fills pointer slots p[], integer slots n[] and
// float slots f[] (src/backend/cuda/launch.rs, `struct Args`, same layout); each kernel names its
// slots at the top. A single layout on both sides means a kernel's arguments cannot drift out of
// step with the Rust code that launches it.
//
// The matrix-vector kernels (matvec.cuh, matvec_tc.cuh) also read a segment table:
// up to MV_SEGS products of one x that run the same kernel share one launch
// (`Backend::matmul_group`: a layer's projections), so the launch ramp and tail are paid once.
// Segment s covers the grid's x blocks from `block0` on (segments one after another, each
// rounded up to whole blocks: a block never mixes segments), reads rows 0..rows of the matrix at
// `w` and writes output vector v at out + v * rows. A single product is a table of one segment;
// `rows == 0` marks the unused ones (every other kernel leaves the table zero).
#define MV_SEGS 4
struct MvSeg {
    unsigned long long w, out;
    int rows, block0;
};

struct Args {
    unsigned long long p[8];
    long long n[12];
    float f[4];
    MvSeg seg[MV_SEGS];
};
// The layout launch.rs fills (a mismatch would shift every slot).
static_assert(sizeof(Args) == 272, "struct Args must match src/backend/cuda/launch.rs");

// This block's segment: the last used one of the first SEGS whose first block is at or before
// blockIdx.x. Constant indices only (the loop unrolls), so the table is read from the parameter
// space. SEGS = 1 for the kernels that never run a group (the fused SwiGLU ones; those for which
// the per-block weight and output pointers cost registers that matter: ptxas -v, see each): their
// segment 0 is a fixed parameter, as cheap as a plain slot.
template <int SEGS>
__device__ __forceinline__ MvSeg mv_segment(const Args& a) {
    static_assert(SEGS >= 1 && SEGS <= MV_SEGS, "segments of the table");
    MvSeg s = a.seg[0];
#pragma unroll
    for (int i = 1; i < SEGS; i++)
        if (a.seg[i].rows > 0 && (int)blockIdx.x >= a.seg[i].block0) s = a.seg[i];
    // One segment starts at block 0: a constant, which spares such kernels a register or a spill
    // (ptxas -v: mvtc_Q6_K 8 bytes of spills with block0 read, none without).
    if (SEGS == 1) s.block0 = 0;
    return s;
}

#define KERNEL extern "C" __global__

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch (Hopper and newer). The host may launch the next kernel before
// this one finishes; that kernel's blocks then start early and wait in `grid_dep_wait` until this
// grid has completed and its memory is visible. Every kernel calls `grid_dep_wait()` before it
// touches memory written by an earlier kernel, so the result is the same as plain stream order;
// only the launch latency (and, for weights, which no kernel writes, the first loads) overlap.
// On older GPUs (and in the compute_80 PTX) both are no-ops.

__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Start of every kernel: wait for the previous grid, then let the next one get scheduled.
__device__ __forceinline__ void kernel_start() {
    grid_dep_wait();
    grid_dep_launch();
}

// Ask L2 to fetch the 128-byte line holding p (read-only data such as weights).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

// The block's dynamic shared memory as an array of T (dev/cuda/host_shim.h provides it on the CPU,
// and dev/cuda/emu/pf_emu.h on its emulator).
#ifdef __CUDACC__
#define DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#elif defined(PF_EMU)
#define DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::pf_emu::dyn_smem())
#endif

// ---------------------------------------------------------------------------------------------
// Reductions. Fixed shuffle order: results do not depend on timing (bit-reproducible runs).

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce over the whole block (blockDim.x a multiple of 32, at most 1024) with WARP (warp_sum or
// warp_max; `neutral` fills the missing warps); every thread gets the result. `sh` is 32 floats of
// shared memory; the leading barrier makes back-to-back calls safe.
template <float (*WARP)(float)>
__device__ __forceinline__ float block_reduce(float v, float* sh, float neutral) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = WARP(v);
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = (l < nw) ? sh[l] : neutral;
    return WARP(v);
}

__device__ __forceinline__ float block_sum(float v, float* sh) { return block_reduce<warp_sum>(v, sh, 0.0f); }
__device__ __forceinline__ float block_max(float v, float* sh) { return block_reduce<warp_max>(v, sh, -INFINITY); }

// 1 / sqrt(sum(x^2)/d + eps) over the d values at x (the RMSNorm scale): each thread strides over
// the group, then a block reduction. Every norm that must match the RMSNorm kernels (norm.cu and
// the fused attention prep, attention.cu) takes its scale from here.
__device__ __forceinline__ float rms_scale(const float* x, int d, float eps, float* sh) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, sh);
    return 1.0f / sqrtf(ss / (float)d + eps);
}

// Pick the best (value, index) pair of the warp under the order BETTER (every lane gets it).
template <class I, bool (*BETTER)(float, I, float, I)>
__device__ __forceinline__ void warp_pick(float& v, I& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const I oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (BETTER(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation functions, written as the CPU reference writes them (src/backend/cpu/mod.rs).

__device__ __forceinline__ float sigmoidf_(float x) {
    // exp(-x) overflows to inf for x < -88: 1/(1+inf) = 0, the right limit.
    return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }

__device__ __forceinline__ float softplusf_(float x) {
    // PyTorch's threshold: above 20 softplus(x) == x in f32, and exp would overflow later.
    return x > 20.0f ? x : log1pf(expf(x));
}

// The delta-rule gate g = ssm_a * softplus(a + dt_bias) of one value head (beta = sigmoidf_(b)).
__device__ __forceinline__ float gdn_g(float a, float ssm_a, float dt_bias) { return ssm_a * softplusf_(a + dt_bias); }

// The delta-rule gates of element i of [T, Hv] (gdn_gates in elementwise.cu, and the gate blocks
// of the fused conv in conv.cu; gdn_step.cu takes gdn_g in registers).
__device__ __forceinline__ void gdn_gate(const float* a, const float* b, const float* ssm_a, const float* dt_bias,
                                         float* g, float* beta, long long i, long long hv) {
    const long long j = i % hv;
    g[i] = gdn_g(a[i], ssm_a[j], dt_bias[j]);
    beta[i] = sigmoidf_(b[i]);
}

// One value of a slice of 256 (this thread's, v) of the gated RMSNorm over groups of d values (d
// divides 256, a multiple of 32: each group d / 32 whole warps): rms_norm(v; w) * silu(z), as
// (v * s) * w * silu(z) with s = 1 / sqrt(sum(v^2) / d + eps). `sh`: 8 floats of shared memory.
// Call from all 256 threads (one barrier). norm.cu gated_rms_norm_slices and gdn_step.cu's tail.
__device__ __forceinline__ float gated_norm_in_slice(float v, float w, float z, int d, float eps, float* sh) {
    const int warp = threadIdx.x / 32, wpg = d / 32;
    const float ws = warp_sum(v * v);
    if ((threadIdx.x & 31) == 0) sh[warp] = ws;
    __syncthreads();
    const int g0 = warp / wpg * wpg;  // the group's first warp
    float ss = 0.0f;
    for (int k = 0; k < wpg; k++) ss += sh[g0 + k];
    const float s = 1.0f / sqrtf(ss / (float)d + eps);
    return __fmul_rn(__fmul_rn(__fmul_rn(v, s), w), siluf_(z));
}

// ---------------------------------------------------------------------------------------------
// Exact conversions of packed small integers to f32, without the slow integer-to-float unit.
// `__byte_perm(w, 0x4B000000, 0x7650 | i)` builds the bit pattern 0x4B0000bb from byte i of w:
// the float 2^23 + bb. Subtracting 2^23 + bias then gives bb - bias exactly (both operands lie in
// [2^23, 2^24), where every integer is representable, and the difference is a small integer).

#define MAGIC_2P23 8388608.0f

template <int I>
__device__ __forceinline__ float byte_as_float(uint32_t w, float magic_minus) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | I)) - magic_minus;
}

// The four bytes of w (each < 256) minus `bias`, as floats, in byte order.
__device__ __forceinline__ void bytes4(uint32_t w, float bias, float& a, float& b, float& c, float& d) {
    const float m = MAGIC_2P23 + bias;
    a = byte_as_float<0>(w, m);
    b = byte_as_float<1>(w, m);
    c = byte_as_float<2>(w, m);
    d = byte_as_float<3>(w, m);
}

// Spread the low 4 bits of v to bit 0 of each byte (bit c -> bit 8c). The products x << 7c never
// overlap for c < 4, so the multiply has no carries.
__device__ __forceinline__ uint32_t spread4(uint32_t v) { return ((v & 0xFu) * 0x00204081u) & 0x01010101u; }

__device__ __forceinline__ float f16_to_f32(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

// ---------------------------------------------------------------------------------------------
// Loads of block-format data, which is only byte- or 2-byte aligned for most formats.

__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return *p; }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

// NW little-endian 32-bit words starting at byte address p (any alignment), read with 16-byte
// aligned vector loads through the read-only cache: the chunks covering [p, p + 4*NW + 4) are
// loaded, shifted down by whole words (two conditional moves, so every array index stays a
// compile-time constant and the words stay in registers) and then by bytes (a funnel shift).
// The chunk reads reach up to 19 bytes past p + 4*NW: weight buffers carry 64 bytes of padding.
template <int NW>
__device__ __forceinline__ void ldwin(const uint8_t* p, uint32_t (&out)[NW]) {
    constexpr int NC = (NW + 7) / 4;  // 16-byte chunks: 4*NC >= NW + 4 words
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint4* c = reinterpret_cast<const uint4*>(a & ~uintptr_t(15));
    const int off = (int)(a & 15);
    uint32_t w[4 * NC];
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const uint4 v = __ldg(c + i);
        w[4 * i + 0] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
    const bool s1 = (off & 4) != 0, s2 = (off & 8) != 0;
    const uint32_t bits = (uint32_t)(off & 3) * 8u;
    uint32_t u1[NW + 3];
#pragma unroll
    for (int i = 0; i < NW + 3; ++i) u1[i] = s1 ? w[i + 1] : w[i];
    uint32_t u2[NW + 1];
#pragma unroll
    for (int i = 0; i < NW + 1; ++i) u2[i] = s2 ? u1[i + 2] : u1[i];
#pragma unroll
    for (int i = 0; i < NW; ++i) out[i] = __funnelshift_r(u2[i], u2[i + 1], bits);
}

// NW words from a 16-byte aligned address (K-quant super-blocks of Q4_K/Q5_K are 144/176 bytes,
// so every one of them is 16-byte aligned in a 256-byte aligned buffer).
template <int NW>
__device__ __forceinline__ void ld_aligned(const uint8_t* p, uint32_t (&out)[NW]) {
    static_assert(NW % 4 == 0, "whole 16-byte chunks");
    const uint4* c = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
        const uint4 v = __ldg(c + i);
        out[4 * i + 0] = v.x;
        out[4 * i + 1] = v.y;
        out[4 * i + 2] = v.z;
        out[4 * i + 3] = v.w;
    }
}

// ---------------------------------------------------------------------------------------------
// A MoE layer's shared expert in the matrix-vector kernels (matvec.cuh,
// matvec_tc.cuh; Backend::moe_experts_shared). Their `_sh_` kernels (SHARED) run it as one more
// expert per token: every token has G = x_group * nsum entries, its k routed ones and then the
// shared one (gate/up: x_group = k + 1 entries read one x row; down: nsum = k + 1 entries sum into
// one output; the other factor is 1). The routed entries read ids and scales at b - b / G (the
// routing's [T, k] layout); the shared one reads its own matrices (`w`, and `w2` for GLU) and is
// scaled by sigmoid(gate_logit[b / G]) (`gate_logits` of a sum; 1 without). The other kernels
// compile to what they were without it: a weight pointer chosen at run time costs the Q6_K
// tensor-core kernel 32 registers (a third of its blocks per SM).
struct MvShared {
    const uint8_t* w;
    const uint8_t* w2;
    const float* gate_logits;
    int G;
};

// The shared expert's slots, the same in every matvec kernel (the segment table took over p0 and
// p3): p7 its W, p3 its W2 (GLU) or its gate logits (a sum; 0: scale 1).
template <bool GLU>
__device__ __forceinline__ MvShared mv_shared_slots(const Args& a, int G) {
    return MvShared{reinterpret_cast<const uint8_t*>(a.p[7]), GLU ? reinterpret_cast<const uint8_t*>(a.p[3]) : nullptr,
                    GLU ? nullptr : reinterpret_cast<const float*>(a.p[3]), G};
}

// Whether entry b is the shared expert's (only in SHARED kernels); `tok` its token there, else 0.
template <bool SHARED>
__device__ __forceinline__ bool mv_shared_entry(const MvShared& sh, int b, int& tok) {
    tok = SHARED ? b / sh.G : 0;
    return SHARED && b - tok * sh.G == sh.G - 1;
}

// Dense weights do not depend on earlier kernels: pull this block's rows row0 .. row0 + rows (of W
// and, for a SwiGLU, W2) into L2 while the previous kernel finishes (programmatic dependent launch).
__device__ __forceinline__ void mv_prefetch_rows(const uint8_t* W, const uint8_t* W2, int row0, int rows,
                                                 size_t row_bytes) {
    const size_t bytes = (size_t)rows * row_bytes;
    for (size_t off = (size_t)threadIdx.x * 128; off < bytes; off += (size_t)blockDim.x * 128) {
        prefetch_l2(W + (size_t)row0 * row_bytes + off);
        if (W2 != nullptr) prefetch_l2(W2 + (size_t)row0 * row_bytes + off);
    }
}

// A MoE down product sums its `nsum` entries (experts) per output in series, each a round trip for
// its weights: after the dependency wait (the routing kernel wrote the ids), pull every entry's rows
// row0 .. row0 + rows of this block (output vector ov) into L2 at once, so that only the first
// entry waits on DRAM. Threads split the (entry, 128-byte line) pairs.
template <bool SHARED>
__device__ __forceinline__ void mv_prefetch_entries(const uint8_t* W, const uint32_t* ids, const MvShared& sh,
                                                    int ov, int nsum, uint32_t n_experts, size_t expert_bytes,
                                                    int row0, int rows, size_t row_bytes) {
    const int lines = (int)(((size_t)rows * row_bytes + 127) / 128);
    for (int i = threadIdx.x; i < nsum * lines; i += blockDim.x) {
        const int j = i / lines, b = ov * nsum + j;
        int tok;
        const uint8_t* We = W;
        if (mv_shared_entry<SHARED>(sh, b, tok)) {
            We = sh.w;
        } else {
            const uint32_t e = ids[b - tok];
            if (e >= n_experts) continue;
            We = W + (size_t)e * expert_bytes;
        }
        prefetch_l2(We + (size_t)row0 * row_bytes + (size_t)(i % lines) * 128);
    }
}

// The shared expert's scale in token tok's sum.
__device__ __forceinline__ float mv_shared_scale(const MvShared& sh, int tok) {
    return sh.gate_logits != nullptr ? sigmoidf_(sh.gate_logits[tok]) : 1.0f;
}
