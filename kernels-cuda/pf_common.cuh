// pf_common.cuh: shared device helpers of the prefill kernels (gemm_q.cu, flash_attn.cu,
// delta_chunked.cu, moe_group.cu): asynchronous copies, ldmatrix, mma.sync on f16 and tf32, and
// small bit tricks. Header-only, everything `static __device__ __forceinline__` inside namespace
// `pf` so that several .cu files can include it into one translation unit (the dev/cuda harness).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" and "...m16n8k8"), with
// g = lane / 4 and t = lane % 4:
//   m16n8k16 f16  A (16x16, row): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//                 B (16x8, col):  b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8..2t+9, n g)
//   m16n8k8 tf32  A (16x8):  a0 = (g, t)  a1 = (g+8, t)  a2 = (g, t+4)  a3 = (g+8, t+4)
//                 B (8x8):   b0 = (k t, n g)  b1 = (k t+4, n g)
//   C/D (16x8 f32, both):    c0 = (g, 2t)  c1 = (g, 2t+1)  c2 = (g+8, 2t)  c3 = (g+8, 2t+1)
// In every packed f16x2 register the element with the smaller column/k index is in the low half.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include <string.h>

#ifdef PF_EMU
// dev/cuda/emu: the kernels compiled as host code and run by a CPU emulator of the CUDA model.
#include "pf_emu.h"
#define PF_DYN_SMEM(name) uint8_t* name = ::pf_emu::dyn_smem()
#else
#define PF_DYN_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#endif

// The block-decoding helpers are also compiled for the host (dev/cuda/host_checks.cu tests them
// against the CPU dequantization without a GPU); PF_HD marks them.
#define PF_HD static __host__ __device__ __forceinline__

namespace pf {

PF_HD float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
PF_HD uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
// Byte permute (PTX prmt, default mode): byte i of the result is byte (s >> 4i) & 7 of {y:x}.
PF_HD uint32_t prmt(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
#endif
}
// Low 32 bits of {hi:lo} >> (s & 31).
PF_HD uint32_t funnel_r(uint32_t lo, uint32_t hi, int s) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, s);
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (s & 31));
#endif
}
PF_HD float h2f(uint32_t bits16) {
    __half_raw r;
    r.x = static_cast<unsigned short>(bits16);
    return __half2float(__half(r));
}

#ifdef PF_EMU
// The emulator provides the asynchronous copies, ldmatrix, mma.sync and cvt.rna.tf32.
static __device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    ::pf_emu::cp_async16(dst, src, src_bytes);
}
static __device__ __forceinline__ void cp_async_commit() { ::pf_emu::cp_async_commit(); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    ::pf_emu::cp_async_wait(N);
}
static __device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
    ::pf_emu::ldsm_x4(r0, r1, r2, r3, p, false);
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                 const void* p) {
    ::pf_emu::ldsm_x4(r0, r1, r2, r3, p, true);
}
static __device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
    ::pf_emu::mma_f16(c, a, b);
}
static __device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
    ::pf_emu::mma_tf32(c, a, b);
}
static __device__ __forceinline__ uint32_t to_tf32(float x) { return ::pf_emu::to_tf32(x); }
#else
static __device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1. `src_bytes` is 16 or 0; 0 reads nothing and
// writes zeros (used for rows past the end of a matrix; `src` must still be a valid address).
static __device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8; register j
// receives this lane's two elements (row lane / 4, columns 2 (lane % 4) ..+1) of matrix j.
static __device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                               const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}
// Same, each matrix transposed: register j receives (row 2 (lane % 4) ..+1, column lane / 4).
static __device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                 const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}

// c += a * b, m16n8k16, f16 inputs, f32 accumulators.
static __device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a * b, m16n8k8, tf32 inputs (f32 bit patterns rounded to tf32), f32 accumulators.
static __device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// f32 -> tf32 (round to nearest, ties away), returned as the f32 bit pattern.
static __device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
#endif  // PF_EMU

// x = hi + lo with hi, lo tf32: the "3xTF32" split. hi*hi + hi*lo + lo*hi carries ~22 bits of
// each operand, so three tf32 products give f32-level accuracy on the tensor cores.
static __device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
    hi = to_tf32(x);
    lo = to_tf32(x - u2f(hi));
}

PF_HD uint32_t pack_half2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    __half2 h = __floats2half2_rn(lo, hi);  // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t*>(&h);
#else
    const __half_raw a = __float2half_rn(lo), b = __float2half_rn(hi);
    return static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(b.x) << 16);
#endif
}

// The lo plane of the f16 pair hi = pack_half2(a, b): f16(a - f32(hi.lo)), f16(b - f32(hi.hi)).
// a - f32(f16(a)) is exact in f32, so hi + lo carries a to 2^-22 |a| (plus f16's subnormal
// spacing); gemm_q.cu's split formats multiply both planes.
PF_HD uint32_t lo_half2(float a, float b, uint32_t hi) {
    return pack_half2(a - h2f(hi & 0xffffu), b - h2f(hi >> 16));
}

// Exact small-integer to float: byte `i` (0..3, a compile-time constant after unrolling) of `v`
// placed in the mantissa of 2^23 gives 2^23 + byte; subtracting `bias` (2^23 + offset) is exact.
PF_HD float byte_as_float(uint32_t v, int i, float bias) {
    return u2f(prmt(v, 0x4B000000u, 0x7540u | i)) - bias;
}
static constexpr float MAGIC = 8388608.0f;  // 2^23

// 16 bytes at an even byte offset `f` of a 16-byte aligned shared-memory row, read as two aligned
// 16-byte loads and shifted into place (GGUF blocks of 210 and 34 bytes are only 2-byte aligned).
// Reads the 32 bytes starting at f & ~15: the caller sizes its rows so that they exist.
PF_HD uint4 ld16_even(const uint8_t* row, int f) {
    const int base = f & ~15;
    const uint4 a = *reinterpret_cast<const uint4*>(row + base);
    const uint4 b = *reinterpret_cast<const uint4*>(row + base + 16);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const int ws = (f >> 2) & 3;            // whole words to skip
    const int hs = ((f >> 1) & 1) * 16;     // then 0 or 16 bits
    uint32_t t[7], v[5];
#pragma unroll
    for (int i = 0; i < 7; i++) t[i] = (ws & 1) ? w[i + 1] : w[i];
#pragma unroll
    for (int i = 0; i < 5; i++) v[i] = (ws & 2) ? t[i + 2] : t[i];
    uint4 o;
    o.x = funnel_r(v[0], v[1], hs);
    o.y = funnel_r(v[1], v[2], hs);
    o.z = funnel_r(v[2], v[3], hs);
    o.w = funnel_r(v[3], v[4], hs);
    return o;
}
// One byte / one little-endian u16 (even offset) of a shared-memory row, via its aligned word.
PF_HD uint32_t ld_u8(const uint8_t* row, int f) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + (f & ~3));
    return (w >> ((f & 3) * 8)) & 0xffu;
}
PF_HD float ld_f16_even(const uint8_t* row, int f) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + (f & ~3));
    return h2f((w >> ((f & 2) * 8)) & 0xffffu);
}

// Programmatic dependent launch (Hopper; kernels-cuda/common.cuh explains it for the decode
// kernels). `pdl_wait`: block until the previous grid has finished and its memory is visible; every
// kernel calls it before touching memory an earlier kernel wrote. `kernel_start` also lets the next
// kernel be scheduled at once (light kernels only: a heavy multi-wave grid must not hand its SM
// slots to a waiting successor). No-ops on older GPUs, in the compute_80 PTX and in the emulator.
static __device__ __forceinline__ void pdl_wait() {
#if !defined(PF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Let the next kernel be scheduled (it still waits in pdl_wait for this grid to finish).
static __device__ __forceinline__ void pdl_trigger() {
#if !defined(PF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
static __device__ __forceinline__ void kernel_start() {
    pdl_wait();
#if !defined(PF_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

}  // namespace pf
