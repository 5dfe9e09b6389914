// dev/cuda/matvec_bench.cu: standalone check and benchmark of the decode matrix-vector kernels
// (llm.c dev/cuda style). It includes the production kernels (kernels-cuda/matvec.cuh) and the
// candidate layouts dev/cuda/matvec_warp.cuh and the tensor-core candidates kernels-cuda/matvec_tc.cuh (Q4_K),
// matvec_tc6.cuh (Q6_K) and matvec_tc8.cuh (Q8_0), runs them
// and a naive baseline on random weights of the formats that dominate decode (Q4_K, Q6_K, Q8_0,
// plus F16 and F32), checks every output against a double-precision CPU dot product of the
// dequantized rows, and times them against the device-to-device copy bandwidth.
//
// Build (here or on the GPU machine; static CUDA runtime, so the binary runs on any driver >= 13.0):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I kernels-cuda \
//        -I dev/cuda dev/cuda/matvec_bench.cu -o matvec_bench
// Run: ./matvec_bench [--quick]
// Output: one line per (format, shape, variant): microseconds per call, GB/s of weight bytes,
// percent of the copy bandwidth, worst error relative to sum |w x|, PASS/FAIL; then a table of
// the fastest exact and fastest q8 (fast tier, dev/cuda/matvec_q8.cuh: retired from the backend, kept here with its numbers) variant per shape and
// the estimated matvec time of one qwen3.5-9b decode step with each. Exit status 1 if any check
// fails. The q8 variants are checked against the CPU product with x quantized the same way
// (so as tightly as the exact ones); their error against f32 x is printed as "vs f32".
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "matvec_q8.cuh"
#define MVTC_BENCH_KERNELS
#include "matvec_tc.cuh"
#include "mvtc_pipe.cuh"
#include "matvec_tc6.cuh"
#include "matvec_tc8.cuh"
#include "matvec_warp.cuh"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                    cudaGetErrorString(e_));                                                    \
            exit(2);                                                                            \
        }                                                                                       \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Host side: random blocks and their exact dequantization (a port of src/quant/*.rs).

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd() {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static float urand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)); }

static float h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t em = h & 0x7fff;
    uint32_t bits;
    if (em >= 0x7c00) {
        bits = (em << 13) | 0x7f800000u | (em > 0x7c00 ? 0x00400000u : 0);
    } else {
        float f;
        uint32_t t = em << 13;
        memcpy(&f, &t, 4);
        f *= 5.192296858534828e+33f;  // 2^112
        memcpy(&bits, &f, 4);
    }
    bits |= sign;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}
static uint16_t f2h(float f) { return __half_as_ushort(__float2half(f)); }
static uint16_t rd16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

enum Kind { K_F32, K_F16, K_Q8_0, K_Q4_K, K_Q6_K };
struct FmtInfo {
    Kind kind;
    const char* name;
    int qk, bytes;
};
static const FmtInfo FORMATS[] = {
    {K_Q4_K, "Q4_K", 256, 144}, {K_Q6_K, "Q6_K", 256, 210}, {K_Q8_0, "Q8_0", 32, 34},
    {K_F16, "F16", 1, 2},       {K_F32, "F32", 1, 4},
};

// One random block with sane scales (values of order 0.01..1).
static void random_block(Kind k, uint8_t* b) {
    switch (k) {
        case K_F32: {
            float v = (urand() * 2 - 1) * 0.1f;
            memcpy(b, &v, 4);
            break;
        }
        case K_F16: {
            uint16_t h = f2h((urand() * 2 - 1) * 0.1f);
            memcpy(b, &h, 2);
            break;
        }
        case K_Q8_0: {
            uint16_t d = f2h(0.0005f + 0.001f * urand());
            memcpy(b, &d, 2);
            for (int i = 0; i < 32; ++i) b[2 + i] = (uint8_t)rnd();
            break;
        }
        case K_Q4_K: {
            uint16_t d = f2h(0.0002f + 0.0004f * urand()), dm = f2h(0.0002f + 0.0004f * urand());
            memcpy(b, &d, 2);
            memcpy(b + 2, &dm, 2);
            for (int i = 4; i < 144; ++i) b[i] = (uint8_t)rnd();
            break;
        }
        case K_Q6_K: {
            for (int i = 0; i < 192; ++i) b[i] = (uint8_t)rnd();
            for (int i = 192; i < 208; ++i) b[i] = (uint8_t)(int8_t)((int)(rnd() % 64) - 32);
            uint16_t d = f2h(0.0001f + 0.0002f * urand());
            memcpy(b + 208, &d, 2);
            break;
        }
    }
}

static void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Dequantize one block (qk values) exactly as src/quant does.
static void dequant_block(Kind k, const uint8_t* b, float* y) {
    switch (k) {
        case K_F32:
            memcpy(y, b, 4);
            break;
        case K_F16:
            y[0] = h2f(rd16(b));
            break;
        case K_Q8_0: {
            const float d = h2f(rd16(b));
            for (int j = 0; j < 32; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
            break;
        }
        case K_Q4_K: {
            const float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
            const uint8_t* sc = b + 4;
            const uint8_t* qs = b + 16;
            for (int c = 0; c < 4; ++c) {
                int s1, m1, s2, m2;
                scale_min_k4(2 * c, sc, s1, m1);
                scale_min_k4(2 * c + 1, sc, s2, m2);
                const float d1 = d * (float)s1, mm1 = dmin * (float)m1, d2 = d * (float)s2, mm2 = dmin * (float)m2;
                for (int l = 0; l < 32; ++l) {
                    y[64 * c + l] = d1 * (float)(qs[32 * c + l] & 0xF) - mm1;
                    y[64 * c + 32 + l] = d2 * (float)(qs[32 * c + l] >> 4) - mm2;
                }
            }
            break;
        }
        case K_Q6_K: {
            const float d = h2f(rd16(b + 208));
            for (int h = 0; h < 2; ++h) {
                const uint8_t* ql = b + 64 * h;
                const uint8_t* qh = b + 128 + 32 * h;
                const int8_t* sc = (const int8_t*)(b + 192 + 8 * h);
                float* yy = y + 128 * h;
                for (int l = 0; l < 32; ++l) {
                    const int is = l / 16;
                    const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                    const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    yy[l] = d * (float)sc[is] * (float)q1;
                    yy[l + 32] = d * (float)sc[is + 2] * (float)q2;
                    yy[l + 64] = d * (float)sc[is + 4] * (float)q3;
                    yy[l + 96] = d * (float)sc[is + 6] * (float)q4;
                }
            }
            break;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels under test.

template <class F>
__global__ void __launch_bounds__(MV_THREADS, 2) mv_prod(const Args a) {
    matvec<F, false>(a);
}

template <class F>
__global__ void __launch_bounds__(MV_THREADS, 2) mv_q8(const Args a) {
    matvec_q8<F, false>(a);
}
// The same with up to 255 registers (one block of 256 threads per SM guaranteed, more if they fit).
template <class F>
__global__ void __launch_bounds__(MV_THREADS, 1) mv_q8_r255(const Args a) {
    matvec_q8<F, false>(a);
}

// One warp per R rows (matvec_warp.cuh), and its Q4_K variant with one lane per 32 quant bytes.
template <class F, int R>
__global__ void __launch_bounds__(MVW_THREADS) mv_warp(const uint8_t* W, const float* x, float* out, int n_out, int n_in,
                                                       size_t row_bytes) {
    matvec_warp<F, R, false>(W, nullptr, x, out, n_out, n_in, row_bytes);
}
template <int R>
__global__ void __launch_bounds__(MVW_THREADS) mv_warp_pair(const uint8_t* W, const float* x, float* out, int n_out,
                                                            int n_in, size_t row_bytes) {
    matvec_warp_q4k_pair<R>(W, x, out, n_out, n_in, row_bytes);
}

// Programmatic dependent launch for the timed chains (MVB_PDL=1), as the backend launches.
static bool g_pdl = false;
template <typename... K, typename... A>
static void launch_k(void (*k)(K...), dim3 g, dim3 b, size_t smem, cudaStream_t st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = b;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = g_pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

// Naive baseline: one warp per row, every lane loops over the row's units, activations read
// from global memory (no staging, no row reuse).
template <class F>
__global__ void mv_naive(const uint8_t* W, const float* x, float* out, int n_out, int n_in, size_t row_bytes) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n_out) return;
    const int units = (n_in + 31) / 32;
    float s = 0.0f;
    for (int u = lane; u < units; u += 32) {
        float xr[32];
        float2 sx = make_float2(0.0f, 0.0f);
        for (int i = 0; i < 32; ++i) {
            xr[i] = 32 * u + i < n_in ? x[32 * u + i] : 0.0f;
            if (i < 16) sx.x += xr[i]; else sx.y += xr[i];
        }
        s += dot_unit<F>(W + (size_t)row * row_bytes, u, n_in, xr, sx);
    }
    s = warp_sum(s);
    if (lane == 0) out[row] = s;
}

// Unit lanes as src/backend/cuda/ops/linear.rs picks them.
static int unit_lanes(int units) {
    const int c[4] = {256, 128, 64, 32};
    for (int ut : c)
        if (units >= ut && units % ut == 0) return ut;
    if (units < 256) {
        int p = 32;
        while (p < units) p *= 2;
        return p;
    }
    return 256;
}

struct Variant {
    std::string name;
    int rpt;     // rows per thread (production), 0 = naive
    bool x_smem;
    int ut = 0;  // unit lanes (0: as the backend picks them)
    int q8 = 0;  // 1: matvec_q8 (fast tier), 2: matvec_q8 with 255 registers
    int warp = 0;  // rows per warp of matvec_warp.cuh (0: not that kernel)
    bool pair = false;  // matvec_warp_q4k_pair
    int tc = 0;         // matvec_tc*.cuh (Q4_K, Q6_K, Q8_0): 16-row tiles per block (0: not that kernel)
    int tc_kw = 0;      // its warps per block (split over the super-blocks)
    bool tc_prep = true;  // time the x split (prep_x) with every call (false: once per case)
    int tc_mode = 0;      // Q4_K, Q8_0 product only (mvtc_pipe.cuh): 1 production loop, 2 double buffer
};

// x split into operand words for the tensor-core kernels (one per case: every variant reads the
// same x): matvec_tc.cuh's A words and sums (Q4_K), matvec_tc6/8.cuh's B words and scales.
static uint32_t* g_tc_xa = nullptr;
static float* g_tc_xs = nullptr;
template <class F>
static void tc_alloc(int n_in) {
    size_t words, floats;
    const size_t tiles = n_in / 256;  // super-blocks (Q4_K, Q6_K) or groups of 8 blocks (Q8_0)
    if constexpr (std::is_same_v<F, FmtQ4_K>) words = tiles * mvtc::SB_WORDS, floats = tiles * mvtc::SB_SUMS;
    else if constexpr (std::is_same_v<F, FmtQ6_K>) words = tiles * mvtc6::SB_WORDS, floats = tiles;
    else words = tiles * mvtc8::G_WORDS, floats = tiles * mvtc8::G_FACT;
    CK(cudaMalloc(&g_tc_xa, words * 4));
    CK(cudaMalloc(&g_tc_xs, floats * 4));
}
template <class F>
static void tc_prep(const float* x, int n_in, cudaStream_t st) {
    if constexpr (std::is_same_v<F, FmtQ4_K>)
        launch_k(mvtc::prep_x, dim3(n_in / 256), dim3(32), 0, st, mvtc::PrepArgs{x, g_tc_xa, g_tc_xs});
    else if constexpr (std::is_same_v<F, FmtQ6_K>)
        launch_k(mvtc6::prep_x, dim3(n_in / 256), dim3(32), 0, st, mvtc6::PrepArgs{x, g_tc_xa, g_tc_xs});
    else
        launch_k(mvtc8::prep_x, dim3(n_in / 256), dim3(32), 0, st, mvtc8::PrepArgs{x, g_tc_xa, g_tc_xs});
}
template <int R, int KW>
static void tc_launch(const uint8_t* W, float* out, int n_out, int n_in, size_t row_bytes, cudaStream_t st) {
    launch_k(mvtc::q4k<R, KW>, dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * KW), 0, st,
             mvtc::Args{W, g_tc_xa, g_tc_xs, out, n_out, n_in, row_bytes});
}
// The mvtc_pipe.cuh variants (Q4_K, Q8_0; product only): mode 1 the production loop, 2 the double
// buffer. F: the production policy, A: its harness Args.
template <class F, class A, int R, int KW>
static void pipe_launch(int mode, const uint8_t* W, float* out, int n_out, int n_in, size_t row_bytes,
                        cudaStream_t st) {
    const dim3 g((n_out + 16 * R - 1) / (16 * R)), b(32 * KW);
    const A a{W, g_tc_xa, g_tc_xs, out, n_out, n_in, row_bytes};
    if (mode == 2) return launch_k(mvpipe::k<F, R, KW, true, A>, g, b, 0, st, a);
    launch_k(mvpipe::k<F, R, KW, false, A>, g, b, 0, st, a);
}
// Whether geometry `key` (100 R + KW) has a mvtc_pipe.cuh instance (then launched).
template <class F, class A>
static bool pipe_by_key(int key, int mode, const uint8_t* W, float* out, int n_out, int n_in, size_t row_bytes,
                        cudaStream_t st) {
    switch (key) {
        case 108: pipe_launch<F, A, 1, 8>(mode, W, out, n_out, n_in, row_bytes, st); return true;
        case 204: pipe_launch<F, A, 2, 4>(mode, W, out, n_out, n_in, row_bytes, st); return true;
        case 208: pipe_launch<F, A, 2, 8>(mode, W, out, n_out, n_in, row_bytes, st); return true;
    }
    return false;
}
template <int R>
static void tc6_launch(const uint8_t* W, float* out, int n_out, int n_in, size_t row_bytes, cudaStream_t st) {
    launch_k(mvtc6::q6k<R>, dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * mvtc6::KW), 0, st,
             mvtc6::Args{W, g_tc_xa, g_tc_xs, out, n_out, n_in, row_bytes});
}
template <int R, int KW>
static void tc8_launch(const uint8_t* W, float* out, int n_out, int n_in, size_t row_bytes, cudaStream_t st) {
    launch_k(mvtc8::q80<R, KW>, dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * KW), 0, st,
             mvtc8::Args{W, g_tc_xa, g_tc_xs, out, n_out, n_in, row_bytes});
}

// Chunk units of the q8 kernel per format (Q8Dot<F>::CU), 0 where it has none.
template <class F>
static constexpr int q8_cu() {
    if constexpr (std::is_same_v<F, FmtQ4_K> || std::is_same_v<F, FmtQ6_K> || std::is_same_v<F, FmtQ8_0> ||
                  std::is_same_v<F, FmtQ5_K>)
        return Q8Dot<F>::CU;
    return 0;
}

template <class F>
static void launch(const Variant& v, const uint8_t* W, const float* x, float* out, int n_out, int n_in,
                   size_t row_bytes, cudaStream_t st) {
    if (v.tc) {
        if (v.tc_prep) tc_prep<F>(x, n_in, st);
        const int key = v.tc * 100 + v.tc_kw;
        if constexpr (std::is_same_v<F, FmtQ4_K>) {
            if (v.tc_mode && pipe_by_key<mvtc::TcQ4K, mvtc::Args>(key, v.tc_mode, W, out, n_out, n_in, row_bytes, st)) return;
            switch (key) {
                case 108: tc_launch<1, 8>(W, out, n_out, n_in, row_bytes, st); return;
                case 204: tc_launch<2, 4>(W, out, n_out, n_in, row_bytes, st); return;
                case 208: tc_launch<2, 8>(W, out, n_out, n_in, row_bytes, st); return;
                case 404: tc_launch<4, 4>(W, out, n_out, n_in, row_bytes, st); return;
            }
        } else if constexpr (std::is_same_v<F, FmtQ6_K>) {
            switch (key) {
                case 108: tc6_launch<1>(W, out, n_out, n_in, row_bytes, st); return;
                case 208: tc6_launch<2>(W, out, n_out, n_in, row_bytes, st); return;
            }
        } else if constexpr (std::is_same_v<F, FmtQ8_0>) {
            if (v.tc_mode && pipe_by_key<mvtc8::TcQ80, mvtc8::Args>(key, v.tc_mode, W, out, n_out, n_in, row_bytes, st)) return;
            switch (key) {
                case 108: tc8_launch<1, 8>(W, out, n_out, n_in, row_bytes, st); return;
                case 204: tc8_launch<2, 4>(W, out, n_out, n_in, row_bytes, st); return;
                case 208: tc8_launch<2, 8>(W, out, n_out, n_in, row_bytes, st); return;
            }
        }
        fprintf(stderr, "no tensor-core instance R=%d KW=%d for this format\n", v.tc, v.tc_kw);
        exit(2);
    }
    if constexpr (q8_cu<F>() > 0) {
        if (v.warp) {
            const int rows_per_block = (MVW_THREADS / 32) * v.warp;
            const dim3 g((n_out + rows_per_block - 1) / rows_per_block);
            if constexpr (std::is_same_v<F, FmtQ4_K>) {
                if (v.pair) {
                    switch (v.warp) {
                        case 1: launch_k(mv_warp_pair<1>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                        case 2: launch_k(mv_warp_pair<2>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                        default: launch_k(mv_warp_pair<4>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                    }
                }
            }
            switch (v.warp) {
                case 1: launch_k(mv_warp<F, 1>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                case 2: launch_k(mv_warp<F, 2>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                case 4: launch_k(mv_warp<F, 4>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
                default: launch_k(mv_warp<F, 8>, g, dim3(MVW_THREADS), 0, st, W, x, out, n_out, n_in, row_bytes); return;
            }
        }
    }
    if (v.rpt == 0) {
        mv_naive<F><<<(n_out + 7) / 8, 256, 0, st>>>(W, x, out, n_out, n_in, row_bytes);
        return;
    }
    const int units = (n_in + 31) / 32;
    const int cu = v.q8 ? q8_cu<F>() : 1;
    const int ut = v.ut ? v.ut : unit_lanes(units / cu);
    const int rpb = (MV_THREADS / ut) * v.rpt;
    Args a;
    memset(&a, 0, sizeof a);
    a.seg[0] = MvSeg{(unsigned long long)W, (unsigned long long)out, n_out, 0};  // one product
    a.p[2] = (unsigned long long)x;
    a.n[1] = n_in;
    a.n[2] = (long long)row_bytes;
    a.n[4] = 1;
    a.n[5] = 1;
    a.n[6] = 1;
    a.n[7] = ut;
    a.n[8] = v.rpt;
    a.n[9] = v.x_smem ? 1 : 0;
    a.n[11] = n_in;
    if constexpr (q8_cu<F>() > 0) {
        if (v.q8) {
            const dim3 g((n_out + rpb - 1) / rpb, 1, 1);
            if (v.q8 == 2)
                mv_q8_r255<F><<<g, MV_THREADS, xq_bytes(units), st>>>(a);
            else
                mv_q8<F><<<g, MV_THREADS, xq_bytes(units), st>>>(a);
            return;
        }
    }
    const int smem = v.x_smem ? units * MV_XPAD * 4 : 0;
    launch_k(mv_prod<F>, dim3((n_out + rpb - 1) / rpb, 1, 1), dim3(MV_THREADS), smem, st, a);
}

template <class F>
static void set_smem() {
    CK(cudaFuncSetAttribute(mv_prod<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    if constexpr (q8_cu<F>() > 0) {
        CK(cudaFuncSetAttribute(mv_q8<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
        CK(cudaFuncSetAttribute(mv_q8_r255<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
    }
}

struct Shape {
    const char* what;
    int n_out, n_in;
    int count;  // how many such matrices one qwen3.5-9b decode step reads (for the estimate)
};

static int failures = 0;

// The fastest exact and q8 variant of one (format, shape), for the winner table.
struct Best {
    double us = 1e30, us_q8 = 1e30;
    std::string name, name_q8;
};
struct Row {
    std::string fmt, shape;
    size_t bytes;
    Best b;
};
static std::vector<Row> table;

// x quantized as matvec_q8.cuh does (the same f32 operations), dequantized.
static std::vector<double> quantize_x_ref(const std::vector<float>& x) {
    std::vector<double> q(x.size());
    for (size_t u = 0; u < x.size() / 32; ++u) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, fabsf(x[32 * u + i]));
        const float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int i = 0; i < 32; ++i) q[32 * u + i] = (double)d * (double)(int)nearbyintf(x[32 * u + i] * id);
    }
    return q;
}

// Times every variant of one (format, shape); returns the fastest exact and q8 variants.
template <class F>
static Best run_case(const FmtInfo& f, const Shape& s, double copy_gbs, bool quick) {
    const int n_out = s.n_out, n_in = s.n_in;
    const size_t row_bytes = (size_t)(n_in / f.qk) * f.bytes;
    const size_t mat_bytes = row_bytes * n_out;
    // Enough copies that one pass over them is several times the 50 MB L2: every timed call
    // reads its weights from HBM.
    const int copies = (int)std::max<size_t>(1, std::min<size_t>(16, (512ull << 20) / mat_bytes + 1));
    std::vector<uint8_t> hw(mat_bytes);
    for (size_t b = 0; b < mat_bytes / f.bytes; ++b) random_block(f.kind, hw.data() + b * f.bytes);
    std::vector<float> hx(n_in);
    for (auto& v : hx) v = urand() * 2 - 1;

    // CPU reference on a sample of rows (all of them for small matrices).
    const int step = n_out > 4096 ? n_out / 2048 : 1;
    const std::vector<double> hxq = quantize_x_ref(hx);
    std::vector<double> ref(n_out, 0.0), mag(n_out, 0.0), refq(n_out, 0.0), magq(n_out, 0.0);
    std::vector<float> y(std::max(f.qk, 256));
    for (int r = 0; r < n_out; r += step) {
        const uint8_t* row = hw.data() + (size_t)r * row_bytes;
        double acc = 0, m = 0, accq = 0, mq = 0;
        for (int blk = 0; blk < n_in / f.qk; ++blk) {
            dequant_block(f.kind, row + (size_t)blk * f.bytes, y.data());
            for (int i = 0; i < f.qk; ++i) {
                acc += (double)y[i] * hx[(size_t)blk * f.qk + i];
                m += fabs((double)y[i] * hx[(size_t)blk * f.qk + i]);
                accq += (double)y[i] * hxq[(size_t)blk * f.qk + i];
                mq += fabs((double)y[i] * hxq[(size_t)blk * f.qk + i]);
            }
        }
        ref[r] = acc;
        mag[r] = m;
        refq[r] = accq;
        magq[r] = mq;
    }

    std::vector<uint8_t*> dW(copies);
    for (int c = 0; c < copies; ++c) {
        CK(cudaMalloc(&dW[c], mat_bytes + 64));
        CK(cudaMemcpy(dW[c], hw.data(), mat_bytes, cudaMemcpyHostToDevice));
        CK(cudaMemset(dW[c] + mat_bytes, 0, 64));
    }
    float *dx, *dout;
    CK(cudaMalloc(&dx, n_in * 4));
    CK(cudaMalloc(&dout, n_out * 4));
    CK(cudaMemcpy(dx, hx.data(), n_in * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    std::vector<Variant> vars = {{"naive warp/row", 0, false}, {"prod rpt=1", 1, true},      {"prod rpt=2", 2, true},
                                 {"prod rpt=4", 4, true},       {"prod rpt=8", 8, true},      {"prod rpt=4 x-global", 4, false},
                                 {"prod ut=64 rpt=4", 4, true, 64}, {"prod ut=64 rpt=8", 8, true, 64}, {"prod ut=32 rpt=8", 8, true, 32}};
    if constexpr (q8_cu<F>() > 0) {
        // Fast tier: geometry sweep (unit lanes over chunks, rows per thread), and 255 registers.
        for (int rpt : {1, 2, 4, 8}) vars.push_back({"q8 rpt=" + std::to_string(rpt), rpt, true, 0, 1});
        for (int ut : {32, 64, 128})
            for (int rpt : {2, 4, 8})
                if ((n_in / 32 / q8_cu<F>()) >= ut) vars.push_back({"q8 ut=" + std::to_string(ut) + " rpt=" + std::to_string(rpt), rpt, true, ut, 1});
        for (int rpt : {2, 4, 8}) vars.push_back({"q8 r255 rpt=" + std::to_string(rpt), rpt, true, 0, 2});
        // One warp per R rows (exact tier).
        for (int r : {1, 2, 4, 8}) vars.push_back({"warp R=" + std::to_string(r), 1, false, 0, 0, r});
        if constexpr (std::is_same_v<F, FmtQ4_K>)
            for (int r : {1, 2, 4}) vars.push_back({"warp pair R=" + std::to_string(r), 1, false, 0, 0, r, true});
    }
    // Tensor cores (exact tier): "tc R=.. KW=.." times the x split and the product together, "tc*
    // ..." the product alone (the split is per x, shared by every product that reads it). Q4_K:
    // matvec_tc.cuh; Q6_K: matvec_tc6.cuh (KW = 8 only, n_in % 2048 == 0); Q8_0: matvec_tc8.cuh.
    std::vector<std::pair<int, int>> tc_geo;
    if constexpr (std::is_same_v<F, FmtQ4_K>) tc_geo = {{1, 8}, {2, 4}, {2, 8}, {4, 4}};
    if constexpr (std::is_same_v<F, FmtQ6_K>)
        if (n_in % 2048 == 0) tc_geo = {{1, 8}, {2, 8}};
    if constexpr (std::is_same_v<F, FmtQ8_0>) tc_geo = {{1, 8}, {2, 4}, {2, 8}};
    if (!tc_geo.empty()) {
        tc_alloc<F>(n_in);
        tc_prep<F>(dx, n_in, st);
        for (auto [r, kw] : tc_geo) {
            const std::string geo = " R=" + std::to_string(r) + " KW=" + std::to_string(kw);
            Variant a{"tc" + geo, 1, false};
            a.tc = r;
            a.tc_kw = kw;
            vars.push_back(a);
            a.name = "tc*" + geo;
            a.tc_prep = false;
            vars.push_back(a);
            // The production loop with the backend's trigger (`tcT`) and the double buffer (`tcD`).
            if ((std::is_same_v<F, FmtQ4_K> || std::is_same_v<F, FmtQ8_0>) && r * 100 + kw != 404) {
                a.tc_mode = 1, a.name = "tcT" + geo;
                vars.push_back(a);
                a.tc_mode = 2, a.name = "tcD" + geo;
                vars.push_back(a);
                a.tc_mode = 0;
            }
        }
    }
    Best best;
    std::vector<float> got(n_out);
    for (const Variant& v : vars) {
        // Check.
        CK(cudaMemset(dout, 0xFF, n_out * 4));
        launch<F>(v, dW[0], dx, dout, n_out, n_in, row_bytes, st);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost));
        double worst = 0, vs_f32 = 0;
        int worst_row = 0;
        const std::vector<double>& rf = v.q8 ? refq : ref;
        const std::vector<double>& mg = v.q8 ? magq : mag;
        for (int r = 0; r < n_out; r += step) {
            const double e = fabs((double)got[r] - rf[r]) / (mg[r] > 0 ? mg[r] : 1e-30);
            if (!(e <= worst)) {  // NaN-safe: a NaN output becomes the worst
                worst = std::isnan(e) ? INFINITY : e;
                worst_row = r;
            }
            vs_f32 = std::max(vs_f32, fabs((double)got[r] - ref[r]) / (mag[r] > 0 ? mag[r] : 1e-30));
        }
        const bool ok = worst <= 1e-5;
        if (!ok) failures++;
        // Time: rotate over the copies so every call reads HBM.
        // MVB_NCU=1: one timed call and no warm-up (under a profiler every launch is replayed).
        const bool ncu = getenv("MVB_NCU") != nullptr;
        const int iters = ncu ? 1 : quick ? 20 : std::max(20, (int)std::min<size_t>(400, (8ull << 30) / mat_bytes));
        for (int i = 0; i < (ncu ? 0 : 3); ++i) launch<F>(v, dW[i % copies], dx, dout, n_out, n_in, row_bytes, st);
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < iters; ++i) launch<F>(v, dW[i % copies], dx, dout, n_out, n_in, row_bytes, st);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1000.0 * ms / iters;
        const double gbs = mat_bytes / (us * 1e3);
        if (ok && (v.rpt > 0 || v.warp > 0 || (v.tc > 0 && v.tc_prep)) && !v.q8 && us < best.us) {
            best.us = us;
            best.name = v.name;
        }
        if (ok && v.q8 && us < best.us_q8) {
            best.us_q8 = us;
            best.name_q8 = v.name;
        }
        printf("%-5s %-14s %6dx%-6d %-20s %9.2f us %8.1f GB/s %5.1f%%  err %.2e (row %d)%s %s\n", f.name, s.what, n_out,
               n_in, v.name.c_str(), us, gbs, 100.0 * gbs / copy_gbs, worst, worst_row,
               v.q8 ? (" vs f32 " + std::to_string(vs_f32).substr(0, 8)).c_str() : "", ok ? "PASS" : "FAIL");
        fflush(stdout);
    }
    for (auto p : dW) CK(cudaFree(p));
    if (g_tc_xa) {
        CK(cudaFree(g_tc_xa));
        CK(cudaFree(g_tc_xs));
        g_tc_xa = nullptr;
        g_tc_xs = nullptr;
    }
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(st));
    table.push_back(Row{f.name, s.what, mat_bytes, best});
    return best;
}

static double copy_bandwidth() {
    const size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; ++i) CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    // A copy reads and writes every byte.
    return 2.0 * 10 * n / (ms * 1e6);
}

int main(int argc, char** argv) {
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device: %s, sm_%d%d, %d SMs, L2 %d MB\n", p.name, p.major, p.minor, p.multiProcessorCount,
           p.l2CacheSize >> 20);
    g_pdl = getenv("MVB_PDL") != nullptr;
    printf("launches: %s\n", g_pdl ? "programmatic dependent launch (MVB_PDL=1)" : "plain stream order");
    set_smem<FmtQ4_K>();
    set_smem<FmtQ6_K>();
    set_smem<FmtQ8_0>();
    set_smem<FmtF16>();
    set_smem<FmtF32>();
    const double copy = copy_bandwidth();
    printf("device-to-device copy: %.1f GB/s (read + write)\n", copy);
    // The matrices of one qwen3.5-9b decode step (n_embd 4096, n_ff 12288, 24 GDN + 8 attention
    // layers): count = how many of that shape a step reads.
    const Shape shapes[] = {
        {"gdn qkv", 8192, 4096, 24},   {"gdn gate/out", 4096, 4096, 48}, {"attn q", 8192, 4096, 8},
        {"attn k/v", 1024, 4096, 16},  {"attn out", 4096, 4096, 8},      {"ffn gate/up", 12288, 4096, 64},
        {"ffn down", 4096, 12288, 32}, {"lm head", 248320, 4096, 1},     {"gdn alpha", 32, 4096, 48},
    };
    double est_q4 = 0, est_q8 = 0, fq4 = 0, fq8 = 0;
    for (const FmtInfo& f : FORMATS) {
        for (const Shape& s : shapes) {
            if (quick && s.n_out > 20000) continue;
            // MVB_SHAPE / MVB_FMT: only the shapes / formats whose names contain these.
            if (getenv("MVB_SHAPE") && !strstr(s.what, getenv("MVB_SHAPE"))) continue;
            if (getenv("MVB_FMT") && strcmp(f.name, getenv("MVB_FMT")) != 0) continue;
            // F32/F16 only on the small shapes (they are not decode formats of the big files).
            if ((f.kind == K_F32 || f.kind == K_F16) && s.n_out * (double)s.n_in > 5e7) continue;
            Best b;
            switch (f.kind) {
                case K_Q4_K: b = run_case<FmtQ4_K>(f, s, copy, quick); break;
                case K_Q6_K: b = run_case<FmtQ6_K>(f, s, copy, quick); break;
                case K_Q8_0: b = run_case<FmtQ8_0>(f, s, copy, quick); break;
                case K_F16: b = run_case<FmtF16>(f, s, copy, quick); break;
                case K_F32: b = run_case<FmtF32>(f, s, copy, quick); break;
            }
            const double us = b.us, usq = std::min(b.us, b.us_q8);
            // Q4_K_M: Q4_K for most, Q6_K for the LM head (and some ffn_down / qkv, ignored here).
            const bool q4m = (f.kind == K_Q4_K && strcmp(s.what, "lm head") != 0) ||
                             (f.kind == K_Q6_K && strcmp(s.what, "lm head") == 0);
            if (q4m) {
                est_q4 += us * s.count;
                fq4 += usq * s.count;
            }
            if (f.kind == K_Q8_0) {
                est_q8 += us * s.count;
                fq8 += usq * s.count;
            }
        }
    }
    printf("\n==== winners (fastest passing variant per shape; %% of the %.0f GB/s copy bandwidth) ====\n", copy);
    printf("%-5s %-14s %10s | %-20s %9s %6s | %-20s %9s %6s | %s\n", "fmt", "shape", "MB", "best exact", "us", "%bw",
           "best q8 (fast tier)", "us", "%bw", "q8 speed-up");
    for (const Row& r : table) {
        const double mb = r.bytes / 1e6;
        auto pct = [&](double us) { return us < 1e29 ? 100.0 * (r.bytes / (us * 1e3)) / copy : 0.0; };
        printf("%-5s %-14s %10.1f | %-20s %9.2f %5.1f%% | %-20s %9.2f %5.1f%% | %s\n", r.fmt.c_str(), r.shape.c_str(), mb,
               r.b.name.c_str(), r.b.us, pct(r.b.us), r.b.us_q8 < 1e29 ? r.b.name_q8.c_str() : "-",
               r.b.us_q8 < 1e29 ? r.b.us_q8 : 0.0, pct(r.b.us_q8),
               r.b.us_q8 < 1e29 ? (std::to_string(r.b.us / r.b.us_q8).substr(0, 4) + "x").c_str() : "-");
    }
    if (!quick) {
        printf("estimated matvec time of one 9B decode step: Q4_K_M %.3f ms (%.0f tokens/s bound), Q8_0 %.3f ms (%.0f)\n",
               est_q4 / 1000, 1e6 / est_q4, est_q8 / 1000, 1e6 / est_q8);
        printf("estimated with the fastest of exact and q8: Q4_K_M %.3f ms (%.0f tokens/s bound), Q8_0 %.3f ms (%.0f)\n",
               fq4 / 1000, 1e6 / fq4, fq8 / 1000, 1e6 / fq8);
    }
    printf("%s: %d failing checks\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
