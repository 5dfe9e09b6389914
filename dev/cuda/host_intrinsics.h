// host_intrinsics.h: device intrinsics of kernels-cuda/ as plain host functions, shared by the two
// CPU builds of the kernels: dev/cuda/host_shim.h (emulate.sh, check_formats.sh) and
// dev/cuda/emu/prod_shim.h (the production kernels on the emu/ emulator). Compile with
// -ffp-contract=off so that __fmul_rn is one rounded product.
#pragma once
#include <cstdint>
#include <cstring>

// Byte n of the result is byte (selector nibble n & 7) of the 8 bytes {x, y}.
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)(((((uint64_t)hi) << 32) | lo) >> (sh & 31));
}
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(uint32_t i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
