// elementwise.cu: the small per-element ops, the delta-rule gates, the q/gate split and argmax.
// Grid-stride loops over n elements; each kernel computes what the CPU reference computes.
#include "common.cuh"

#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// acc += x. Slots: p0 acc, p1 x; n0 n.
KERNEL void add_assign(const Args a) {
    kernel_start();
    float* acc = reinterpret_cast<float*>(a.p[0]);
    const float* x = reinterpret_cast<const float*>(a.p[1]);
    GRID_STRIDE(i, a.n[0]) acc[i] = acc[i] + x[i];
}

// out = silu(gate) * up. Slots: p0 gate, p1 up, p2 out; n0 n.
KERNEL void swiglu(const Args a) {
    kernel_start();
    const float* g = reinterpret_cast<const float*>(a.p[0]);
    const float* u = reinterpret_cast<const float*>(a.p[1]);
    float* o = reinterpret_cast<float*>(a.p[2]);
    GRID_STRIDE(i, a.n[0]) o[i] = siluf_(g[i]) * u[i];
}

// x *= sigmoid(gate). Slots: p0 x, p1 gate; n0 n.
KERNEL void sigmoid_mul_assign(const Args a) {
    kernel_start();
    float* x = reinterpret_cast<float*>(a.p[0]);
    const float* g = reinterpret_cast<const float*>(a.p[1]);
    GRID_STRIDE(i, a.n[0]) x[i] = x[i] * sigmoidf_(g[i]);
}

// acc[t][i] += sigmoid(gate_logit[t]) * x[t][i]. Slots: p0 acc, p1 x, p2 gate_logit; n0 T*d, n1 d.
KERNEL void sigmoid_scale_add(const Args a) {
    kernel_start();
    float* acc = reinterpret_cast<float*>(a.p[0]);
    const float* x = reinterpret_cast<const float*>(a.p[1]);
    const float* gl = reinterpret_cast<const float*>(a.p[2]);
    const long long d = a.n[1];
    GRID_STRIDE(i, a.n[0]) acc[i] = acc[i] + sigmoidf_(gl[i / d]) * x[i];
}

// beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias). Slots: p0 a, p1 b, p2 ssm_a, p3 dt_bias,
// p4 g_out, p5 beta_out; n0 T*Hv, n1 Hv.
KERNEL void gdn_gates(const Args a) {
    kernel_start();
    const float* av = reinterpret_cast<const float*>(a.p[0]);
    const float* bv = reinterpret_cast<const float*>(a.p[1]);
    const float* sa = reinterpret_cast<const float*>(a.p[2]);
    const float* dt = reinterpret_cast<const float*>(a.p[3]);
    float* go = reinterpret_cast<float*>(a.p[4]);
    float* bo = reinterpret_cast<float*>(a.p[5]);
    GRID_STRIDE(i, a.n[0]) gdn_gate(av, bv, sa, dt, go, bo, i, a.n[1]);
}

// [q_0|gate_0|q_1|gate_1|...] -> q, gate. Slots: p0 qg, p1 q, p2 gate; n0 n (= T*H*D), n1 D.
KERNEL void split_qgate(const Args a) {
    kernel_start();
    const float* qg = reinterpret_cast<const float*>(a.p[0]);
    float* q = reinterpret_cast<float*>(a.p[1]);
    float* g = reinterpret_cast<float*>(a.p[2]);
    const long long d = a.n[1];
    GRID_STRIDE(i, a.n[0]) {
        const long long head = i / d, k = i % d;  // i indexes q: head (over T*H) and offset
        q[i] = qg[2 * head * d + k];
        g[i] = qg[2 * head * d + d + k];
    }
}

// ---------------------------------------------------------------------------------------------
// argmax, in two passes: blocks reduce chunks of a row to (value, index) pairs, then one warp
// per row reduces the pairs. NaN and -inf are never chosen; ties keep the lowest index; a row
// with nothing else gives NON_FINITE (0xFFFFFFFF), as the CPU reference.

#define ARGMAX_NONE 0xFFFFFFFFu

// Is (v, i) better than (bv, bi)? Invalid entries carry index ARGMAX_NONE.
__device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
    if (i == ARGMAX_NONE) return false;
    if (bi == ARGMAX_NONE) return true;
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, uint32_t& i) { warp_pick<uint32_t, better>(v, i); }

// Pass 1. Slots: p0 logits [T, V], p1 partials (float2 as (value, index bits)) [T, P]; n0 V,
// n1 chunk (elements per block). Grid: (P, T); block 256.
KERNEL void argmax_partial(const Args a) {
    kernel_start();
    __shared__ float sv[8];
    __shared__ uint32_t si[8];
    const long long V = a.n[0], chunk = a.n[1];
    const float* row = reinterpret_cast<const float*>(a.p[0]) + (size_t)blockIdx.y * V;
    float2* part = reinterpret_cast<float2*>(a.p[1]) + (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    const long long s = blockIdx.x * chunk, e = min(V, s + chunk);
    float bv = 0.0f;
    uint32_t bi = ARGMAX_NONE;
    for (long long k = s + threadIdx.x; k < e; k += blockDim.x) {
        const float x = row[k];
        if (isnan(x) || x == -INFINITY) continue;
        if (bi == ARGMAX_NONE || x > bv) {  // increasing k: strict '>' keeps the first
            bv = x;
            bi = (uint32_t)k;
        }
    }
    warp_argmax(bv, bi);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = l < (int)(blockDim.x / 32) ? sv[l] : 0.0f;
        bi = l < (int)(blockDim.x / 32) ? si[l] : ARGMAX_NONE;
        warp_argmax(bv, bi);
        if (l == 0) *part = make_float2(bv, __uint_as_float(bi));
    }
}

// Pass 2. Slots: p0 partials [T, P], p1 out (u32 [T]); n0 P. Grid: T; block 32.
KERNEL void argmax_final(const Args a) {
    kernel_start();
    const long long P = a.n[0];
    const float2* part = reinterpret_cast<const float2*>(a.p[0]) + (size_t)blockIdx.x * P;
    uint32_t* out = reinterpret_cast<uint32_t*>(a.p[1]);
    float bv = 0.0f;
    uint32_t bi = ARGMAX_NONE;
    for (long long k = threadIdx.x; k < P; k += 32) {
        const float2 p = part[k];
        const uint32_t pi = __float_as_uint(p.y);
        if (better(p.x, pi, bv, bi)) {
            bv = p.x;
            bi = pi;
        }
    }
    warp_argmax(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi;  // ARGMAX_NONE == NON_FINITE
}
