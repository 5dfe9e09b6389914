// embed.cu: token embedding lookup, out[t] = dequant(table[ids[t]]), for every weight format.
//
// One thread per 32-element unit of an output row: it decodes the unit in registers
// (formats.cuh, bit-identical to the CPU reference) and writes it. Ids past the vocabulary give
// a zero row (the host cannot see ids on the device; the executor never produces such ids).
#include "formats.cuh"

// Slots: p0 table, p1 ids (u32 [T]), p2 out [T, d]; n0 vocab, n1 d, n2 row_bytes.
// Grid: (ceil(units / 64), T); block 64.
template <class F>
__device__ __forceinline__ void embed(const Args& a) {
    kernel_start();
    const uint8_t* table = reinterpret_cast<const uint8_t*>(a.p[0]);
    const uint32_t* ids = reinterpret_cast<const uint32_t*>(a.p[1]);
    float* out = reinterpret_cast<float*>(a.p[2]);
    const uint32_t vocab = (uint32_t)a.n[0];
    const int d = (int)a.n[1];
    const size_t row_bytes = (size_t)a.n[2];
    const int t = blockIdx.y;
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (32 * u >= d) return;
    const uint32_t id = ids[t];
    float y[32];
    if (id < vocab) {
        dec_unit<F>(table + (size_t)id * row_bytes, u, d, y);
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) y[i] = 0.0f;
    }
    float* o = out + (size_t)t * d + 32 * u;
#pragma unroll
    for (int i = 0; i < 32; ++i)
        if (32 * u + i < d) o[i] = y[i];
}

#define EMBED_KERNEL(name, F) \
    KERNEL void embed_##name(const Args a) { embed<F>(a); }

FOR_EACH_FORMAT(EMBED_KERNEL)
