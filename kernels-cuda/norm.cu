// norm.cu: RMSNorm (plain, fused with the residual add, gated) and the per-head L2 norm of q/k.
//
// One block per group of d values (a token's hidden vector, or one head). Each thread strides
// over the group; the sum of squares is a block reduction. Values are computed as the CPU
// reference writes them: s = 1 / sqrt(mean(x^2) + eps), y = (x * s) * w (two roundings).
//
// Slot p6 (all three RMSNorms): when non-zero, the same outputs rounded to f16 (round to nearest,
// as pf_f32_to_f16 writes them) at the same index: the f16 copy a tensor-core product of the fast
// prefill path reads next (src/backend/cuda/shadow.rs), written here instead of by one more launch.
// Slot p7 (rms_norm, add_rms_norm; decode): when non-zero, each output row also prepared for the
// tensor-core decode products (matvec_tc.cuh `prep_row`: A words of all rows at p7, then their
// sums), which saves each product's input one prep launch. Needs d % 256 == 0 and whole warps (the
// host checks both).
#include "common.cuh"
#ifdef __CUDACC__
#include "matvec_tc.cuh"  // (dev/cuda/emulate.sh's host build leaves slot p7 zero: no tensor cores there)
#endif

// The prepared copy of this block's output row (slot p7), when asked for.
__device__ __forceinline__ void prep_out_row(const Args& a, const float* out_row, int d) {
    if (a.p[7] == 0) return;
#ifdef __CUDACC__
    const size_t nsb = (size_t)d / 256;
    uint32_t* xa = reinterpret_cast<uint32_t*>(a.p[7]);
    float* xs = reinterpret_cast<float*>(xa + gridDim.x * nsb * mvtc::SB_WORDS);
    __syncthreads();  // every thread's outputs written
    mvtc::prep_row(out_row, d, xa + blockIdx.x * nsb * mvtc::SB_WORDS, xs + blockIdx.x * nsb * mvtc::SB_SUMS);
#else
    (void)out_row;
    (void)d;
#endif
}

// out[i] = v, and the f16 copy when there is one.
__device__ __forceinline__ void put(float* out, __half* out16, size_t i, float v) {
    out[i] = v;
    if (out16 != nullptr) out16[i] = __float2half_rn(v);
}

// out = rms_norm(x; w). Slots: p0 x, p1 w [d], p2 out, p6 f16 out or 0, p7 prepared out or 0; n0 d;
// f0 eps. Grid: groups.
KERNEL void rms_norm(const Args a) {
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

// acc += x; out = rms_norm(acc; w). Slots: p0 acc, p1 x, p2 w, p3 out, p6 f16 out or 0, p7 prepared
// out or 0; n0 d; f0 eps.
KERNEL void add_rms_norm(const Args a) {
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
