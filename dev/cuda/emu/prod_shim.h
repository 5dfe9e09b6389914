// prod_shim.h: what kernels-cuda/common.cuh (the production kernels' shared header) needs beyond
// pf_emu.h, so that mvtc_checks.cpp can run production kernels (norm.cu) on the emulator.
#pragma once

#include "../host_intrinsics.h"
#include "pf_emu.h"

template <class V>
inline V __ldg(const V* p) {
    if (sizeof(V) == 16 && reinterpret_cast<uintptr_t>(p) % 16) ::pf_emu::fail("misaligned 16-byte load");
    V v;
    memcpy(&v, p, sizeof(V));
    return v;
}
// A load that skips L1 (on the CPU: a load).
inline float __ldcg(const float* p) { return *p; }
inline float4 __ldcg(const float4* p) { return __ldg(p); }
