// host_shim.h: just enough of CUDA, in plain C++, to compile kernels-cuda/ for the CPU before any
// GPU time is spent: dev/cuda/check_formats.sh checks every weight decoder against ggml's stored
// dequantization, and dev/cuda/emulate.sh (RILL_EMULATE_THREADS) runs whole kernels with one OS
// thread per CUDA thread, real block barriers and warp shuffles. Semantics follow the CUDA
// documentation; compile with -ffp-contract=off so that products and sums round like __fmul_rn.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
using std::isnan;
using std::max;
using std::min;

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct uint4 {
    uint32_t x, y, z, w;
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
#ifdef RILL_EMULATE_THREADS
inline thread_local Dim3 threadIdx;
#else
inline Dim3 threadIdx;
#endif
inline Dim3 blockIdx, blockDim, gridDim;
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

// A GPU faults on a misaligned 16-byte load; here it would silently work.
template <class V>
inline V ldg16(const V* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
        fprintf(stderr, "misaligned 16-byte load at %p\n", (const void*)p);
        abort();
    }
    V v;
    memcpy(&v, p, 16);
    return v;
}
inline uint4 __ldg(const uint4* p) { return ldg16(p); }
inline float4 __ldg(const float4* p) { return ldg16(p); }
inline float __ldg(const float* p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

#include "host_intrinsics.h"  // __byte_perm, __funnelshift_r, __int_as_float, __uint_as_float, __fmul_rn
inline uint32_t __float_as_uint(float f) {
    uint32_t i;
    memcpy(&i, &f, 4);
    return i;
}
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

// IEEE binary16 to f32, exact (subnormals included).
typedef uint16_t __half;
inline __half __ushort_as_half(unsigned short h) { return h; }
inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fff;
    uint32_t bits;
    if (em >= 0x7c00) {
        bits = (em << 13) | 0x7f800000u | (em > 0x7c00 ? 0x00400000u : 0);
    } else {
        bits = __float_as_uint(__uint_as_float(em << 13) * 5.192296858534828e+33f);  // * 2^112
    }
    return __uint_as_float(bits | sign);
}

// f32 to IEEE binary16, round to nearest even (subnormals, overflow to inf, NaN kept quiet), as the
// device's __float2half_rn.
inline __half __float2half_rn(float f) {
    const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (__half)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (__half)(sign | 0x7c00u);  // rounds to above 65504: inf
    if (ax < 0x38800000u) {
        // Subnormal (or zero) in f16: the value in units of 2^-24, rounded to nearest even.
        const float v = __uint_as_float(ax) * 16777216.0f;  // exact: a power-of-two scaling
        return (__half)(sign | (uint32_t)std::nearbyint(v));
    }
    // Normal: drop 13 mantissa bits with round to nearest even (a carry into the exponent is right).
    const uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
    return (__half)(sign | ((r - 0x38000000u) >> 13));
}

#ifndef RILL_EMULATE_THREADS
// Warp and block primitives are not used by the decoders; single-lane stand-ins let common.cuh
// compile.
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int) {
    return v;
}
inline void __syncthreads() {}
inline unsigned char* emu_dynamic_smem() {
    static unsigned char buf[1 << 20];
    return buf;
}
#else
#include <barrier>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// One emulated block: a barrier for __syncthreads, and per warp a barrier and an exchange buffer
// for the shuffles (every lane of a warp shuffles together, as full-mask shuffles require).
struct EmuBlock {
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warp;
    std::vector<uint64_t> exch;
    explicit EmuBlock(unsigned threads) : block((std::ptrdiff_t)threads), exch(threads) {
        for (unsigned w = 0; w < threads / 32; ++w) warp.push_back(std::make_unique<std::barrier<>>(32));
    }
};
inline thread_local EmuBlock* emu_block = nullptr;
inline std::vector<unsigned char> emu_smem;

inline void __syncthreads() { emu_block->block.arrive_and_wait(); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) <= 8, "shuffle of a word");
    const unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    emu_block->exch[t] = bits;
    emu_block->warp[w]->arrive_and_wait();
    bits = emu_block->exch[w * 32 + (lane ^ (unsigned)o)];
    emu_block->warp[w]->arrive_and_wait();
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}

inline unsigned char* emu_dynamic_smem() { return emu_smem.data(); }

// Blocks run one after another, so a block's atomics and fences see every earlier block's
// writes: plain operations under a lock suffice.
inline std::mutex emu_atomic_lock;
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    std::lock_guard<std::mutex> g(emu_atomic_lock);
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicExch(unsigned* p, unsigned v) {
    std::lock_guard<std::mutex> g(emu_atomic_lock);
    const unsigned old = *p;
    *p = v;
    return old;
}
inline void __threadfence() {}
inline float __ldcg(const float* p) { return *p; }

// Run kernel(args) over grid x block threads, one block after another, each block with one OS
// thread per CUDA thread (blocks of a multiple of 32 threads).
template <class A>
inline void emu_launch(void (*kernel)(A), Dim3 grid, unsigned block, size_t smem, const A& args) {
    emu_smem.assign(smem + 16, 0);
    gridDim = grid;
    blockDim = Dim3{block, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = Dim3{x, y, z};
                EmuBlock b(block);
                std::vector<std::thread> ts;
                ts.reserve(block);
                for (unsigned t = 0; t < block; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = Dim3{t, 0, 0};
                        emu_block = &b;
                        kernel(args);
                    });
                for (auto& th : ts) th.join();
            }
}
#endif
#define DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(emu_dynamic_smem())
