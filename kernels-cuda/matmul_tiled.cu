// matmul_tiled.cu: out[t][o] = sum_i W[o][i] * x[t][i] for batches of tokens (prefill), on weights
// in their block formats, in f32 (the exact precision tier).
//
// A block computes a 64-row x 64-token tile. Per step of 64 input elements it decodes the tile's
// weights (2 units of 32 per row, formats.cuh) into shared memory, stages the 64 x 64 inputs,
// and every thread accumulates a 4 x 4 register tile. Each weight byte is read once per 64 tokens.
// This is the plain correct prefill path; tensor-core kernels (gemm_*.cu) replace it per format.
#include "formats.cuh"

#define MT_TILE 64
#define MT_K 64
#define MT_PAD 68  // row stride of the shared tiles (floats): 16-byte aligned rows

// Slots: p0 W, p1 x [T, n_in], p2 out [T, n_out]; n0 n_out, n1 n_in, n2 row_bytes, n3 T.
// Grid: (ceil(n_out / 64), ceil(T / 64)); block 256.
template <class F>
__device__ __forceinline__ void matmul_tiled(const Args& a) {
    kernel_start();
    __shared__ __align__(16) float Ws[MT_K][MT_PAD];  // Ws[k][row]
    __shared__ __align__(16) float Xs[MT_K][MT_PAD];  // Xs[k][token]
    const uint8_t* W = reinterpret_cast<const uint8_t*>(a.p[0]);
    const float* X = reinterpret_cast<const float*>(a.p[1]);
    float* out = reinterpret_cast<float*>(a.p[2]);
    const int n_out = (int)a.n[0], n_in = (int)a.n[1], T = (int)a.n[3];
    const size_t row_bytes = (size_t)a.n[2];
    const int r0 = blockIdx.x * MT_TILE, t0 = blockIdx.y * MT_TILE;
    const int tid = threadIdx.x, tm = tid % 16, tn = tid / 16;
    const int units = (n_in + 31) / 32;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < n_in; k0 += MT_K) {
        // Weights: threads 0..127 decode unit (k0/32 + tid%2) of row r0 + tid/2.
        if (tid < 2 * MT_TILE) {
            const int r = tid / 2, uu = tid % 2, u = k0 / 32 + uu;
            float y[32];
            if (r0 + r < n_out && u < units) {
                dec_unit<F>(W + (size_t)(r0 + r) * row_bytes, u, n_in, y);
            } else {
#pragma unroll
                for (int i = 0; i < 32; ++i) y[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 32; ++i) Ws[32 * uu + i][r] = y[i];
        }
        // Inputs: 64 tokens x 64 elements, read along the row (coalesced).
        for (int idx = tid; idx < MT_TILE * MT_K; idx += blockDim.x) {
            const int tok = idx / MT_K, kk = idx % MT_K;
            const int tt = t0 + tok, k = k0 + kk;
            Xs[kk][tok] = (tt < T && k < n_in) ? X[(size_t)tt * n_in + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < MT_K; ++kk) {
            const float4 w4 = *reinterpret_cast<const float4*>(&Ws[kk][4 * tm]);
            const float4 x4 = *reinterpret_cast<const float4*>(&Xs[kk][4 * tn]);
            const float wv[4] = {w4.x, w4.y, w4.z, w4.w};
            const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int tt = t0 + 4 * tn + j;
        if (tt >= T) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = r0 + 4 * tm + i;
            if (r < n_out) out[(size_t)tt * n_out + r] = acc[i][j];
        }
    }
}

#define MATMUL_TILED_KERNEL(name, F) \
    KERNEL void __launch_bounds__(256) matmul_tiled_##name(const Args a) { matmul_tiled<F>(a); }

FOR_EACH_FORMAT(MATMUL_TILED_KERNEL)
