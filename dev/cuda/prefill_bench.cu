// prefill_bench.cu: standalone checks and timings of the prefill kernels in kernels-cuda/
// (llm.c dev/cuda style: the kernel files are included as they are, so what is tested is what the
// backend loads).
//
//   prefill_bench [all|checks|gemm|delta|attn|moe|peak] [--quick]   logs also to $OUT/prefill.log
//   (`checks`: the correctness parts only, small shapes, for compute-sanitizer; --quick: fewer cases)
//
// Every check: random inputs (never zeros), the output poisoned with NaN before the run, a CPU
// reference in f64 from the exact f32 dequantization of src/quant, rel L2 and max |err| / max
// |ref| against a stated bound. GEMM outputs are checked twice: against the same products of the
// operands as the kernel reads them (tight: only accumulation order differs, so any indexing error
// shows) and against the exact f32 operands (the tier: fixtures "f16-rounded activations", rel L2
// <= 6e-3, for the quantized formats; f32-class, rel L2 <= 2e-5, for F16/BF16 weights, whose
// products take x as two f16 planes hi + lo).
// Timings: CUDA events, warm-up, median of several runs, weights rotated through copies that
// together exceed the L2 cache. The summary table is printed last.
#include "../../kernels-cuda/delta_chunked.cu"
#include "../../kernels-cuda/flash_attn.cu"
#include "../../kernels-cuda/gemm_q.cu"
#include "../../kernels-cuda/moe_group.cu"
#include "pf_host.h"
#include "pf_gemm_host.h"

using namespace host;

static Log LOG;
static int g_sms = 132;
static bool g_quick = false;
static bool g_perf = true;  // false in mode `checks`: correctness only (for compute-sanitizer)
static int g_fail = 0;

static const char* pass(bool ok) {
    if (!ok) g_fail++;
    return ok ? "PASS" : "FAIL";
}

// ================================================================ device helpers

__device__ __forceinline__ uint64_t dmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ float dunit(uint64_t h) { return (h >> 40) * (1.0f / 16777216.0f); }  // [0, 1)

__global__ void k_gen_bytes(uint64_t* p, long long nwords, uint64_t seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nwords; i += (long long)gridDim.x * blockDim.x)
        p[i] = dmix(seed ^ dmix(i));
}
// Sane f16 scales in random blocks: d (and dmin) = (1 + u) 2^e; one block in 16 gets a scale
// 2^-8 smaller (an f16 subnormal for the K-quants), as real tensors of tiny values have.
__global__ void k_fix_scales(int fmt, uint8_t* w, long long nblocks, uint64_t seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nblocks; i += (long long)gridDim.x * blockDim.x) {
        const uint64_t h = dmix(seed ^ dmix(i));
        const float small = (h & 15) == 0 ? 1.0f / 256.0f : 1.0f;
        const float u1 = 1.0f + dunit(h), u2 = 1.0f + dunit(dmix(h));
        switch (fmt) {
            case Q4K: {
                uint8_t* b = w + 144 * i;
                *reinterpret_cast<__half*>(b) = __float2half_rn(u1 * 0x1p-13f * small);
                *reinterpret_cast<__half*>(b + 2) = __float2half_rn(u2 * 0x1p-13f * small);
            } break;
            case Q5K: {
                uint8_t* b = w + 176 * i;
                *reinterpret_cast<__half*>(b) = __float2half_rn(u1 * 0x1p-14f * small);
                *reinterpret_cast<__half*>(b + 2) = __float2half_rn(u2 * 0x1p-14f * small);
            } break;
            case Q6K: *reinterpret_cast<__half*>(w + 210 * i + 208) = __float2half_rn(u1 * 0x1p-14f * small); break;
            case Q80: *reinterpret_cast<__half*>(w + 34 * i) = __float2half_rn(u1 * 0x1p-11f * small); break;
        }
    }
}
// n 16-bit floats: f16 (bf16 = false) or bf16 of uniform(-0.1, 0.1) (scaled by `scale`).
__global__ void k_gen_f16(uint16_t* p, long long n, uint64_t seed, bool bf16, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = (dunit(dmix(seed ^ dmix(i))) * 2.0f - 1.0f) * scale;
        if (bf16) {
            uint32_t u = __float_as_uint(v);
            u += 0x7fffu + ((u >> 16) & 1u);
            p[i] = static_cast<uint16_t>(u >> 16);
        } else {
            p[i] = __half_as_ushort(__float2half_rn(v));
        }
    }
}
// n f32 values uniform in [-scale, scale).
__global__ void k_gen_f32(float* p, long long n, uint64_t seed, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = (dunit(dmix(seed ^ dmix(i))) * 2.0f - 1.0f) * scale;
}
__global__ void k_fill_u32(uint32_t* p, long long n, uint32_t v) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) p[i] = v;
}
// max |a - b| and max |b| over n (non-negative floats compare as their bit patterns); NaN -> +inf.
__global__ void k_diff(const float* a, const float* b, long long n, unsigned* out) {
    float md = 0.f, mb = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float d = fabsf(a[i] - b[i]);
        if (!(d == d)) d = INFINITY;
        md = fmaxf(md, d);
        mb = fmaxf(mb, fabsf(b[i]));
    }
    atomicMax(out, __float_as_uint(md));
    atomicMax(out + 1, __float_as_uint(mb));
}
// mma.sync f16 peak: 8 independent accumulators per warp.
__global__ void k_mma_peak(float* out, int iters) {
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; i++) a[i] = 0x3c003c00u ^ (threadIdx.x * 7919u + i);
    b[0] = 0x3c003c00u ^ threadIdx.x;
    b[1] = 0x3c003c00u ^ (threadIdx.x * 3u);
    float c[8][4] = {};
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int j = 0; j < 8; j++) pf::mma_f16(c[j], a, b);
    float s = 0.f;
    for (int j = 0; j < 8; j++) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    if (s == 1234.5f) out[0] = s;  // keep the work alive
}

static void poison(void* p, size_t bytes) { CK(cudaMemset(p, 0xff, bytes)); }  // NaN floats
static uint64_t g_seed = 1;
static void gen_bytes(void* p, size_t bytes) {
    k_gen_bytes<<<1024, 256>>>(static_cast<uint64_t*>(p), (long long)(bytes / 8), g_seed++);
    CKL();
}
static double dev_maxrel_diff(const float* a, const float* b, long long n) {
    unsigned* d;
    CK(cudaMalloc(&d, 8));
    CK(cudaMemset(d, 0, 8));
    k_diff<<<1024, 256>>>(a, b, n, d);
    CKL();
    unsigned h[2];
    CK(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    float md, mb;
    memcpy(&md, &h[0], 4);
    memcpy(&mb, &h[1], 4);
    return mb > 0 ? md / mb : md;
}

// ================================================================ GEMM plumbing

static int OCC[NFMT][3];

static void gemm_setup() {
    for (int f = 0; f < NFMT; f++)
        for (int c = 0; c < 3; c++) {
            CK(cudaFuncSetAttribute(KERN[f][c], cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM[f][c]));
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&OCC[f][c], KERN[f][c], CFG[c].nth, SMEM[f][c]));
            LOG.line("gemm kernel %-5s %-9s smem %6d B  CTAs/SM %d", FMT_NAME[f], CFG[c].name, SMEM[f][c], OCC[f][c]);
            if (OCC[f][c] < 1) {
                LOG.line("FAIL: kernel %s %s cannot be resident", FMT_NAME[f], CFG[c].name);
                g_fail++;
            }
        }
}

struct Plan {
    int cfg = 0, splits = 1, per = 0;
    double est_us = 0;
};
// Cost model (dev/cuda/DECISIONS.md, prefill; the harness measures every candidate and prints the
// best, so the model can be corrected from one run): waves of CTAs, each CTA's MACs at an assumed
// per-SM rate shared by the CTAs resident on an SM, at least the bytes each tile reads over HBM
// bandwidth, plus the split-K partial traffic.
static Plan plan_gemm(int fmt, int rows, int n, int k, int only_cfg = -1) {
    const double R_SM = 1.5e12, BW = 3.0e12, HBM = 3.5e12;  // MAC/s per SM (~400 TFLOP/s), bytes/s
    const int nsteps = k / 64;
    Plan best;
    best.est_us = 1e30;
    for (int c = 0; c < 3; c++) {
        if (only_cfg >= 0 && c != only_cfg) continue;
        const int occ = std::max(1, OCC[fmt][c]);
        const long long tm = (rows + CFG[c].bm - 1) / CFG[c].bm, tn = (n + CFG[c].bn - 1) / CFG[c].bn;
        for (int s : {1, 2, 3, 4, 6, 8}) {
            const int per = steps_per_split(fmt, nsteps, s);
            if ((nsteps + per - 1) / per != s) continue;
            if (s > 1 && per < 4 * rstep(fmt) && per < 8) continue;
            const long long ctas = tm * tn * s;
            const long long waves = (ctas + (long long)g_sms * occ - 1) / ((long long)g_sms * occ);
            const double cta_s = (double)CFG[c].bm * CFG[c].bn * per * 64 / (R_SM * CFG[c].eff / occ);
            // Memory floor: every M tile reads all weight rows, every N tile all x rows.
            const double bytes = (double)tm * n * row_bytes(fmt, k) + (double)tn * rows * k * 2.0 + (double)rows * n * 4.0;
            double t = std::max(waves * cta_s, bytes / HBM) + 3e-6;
            if (s > 1) t += (2.0 * s + 1.0) * rows * n * 4.0 / BW + 3e-6;
            if (t * 1e6 < best.est_us) {
                best.cfg = c;
                best.splits = s;
                best.per = per;
                best.est_us = t * 1e6;
            }
        }
    }
    return best;
}

static float* g_ws = nullptr;  // split-K workspace
static size_t g_ws_bytes = 0;
static void ensure_ws(size_t bytes) {
    if (bytes <= g_ws_bytes) return;
    if (g_ws) CK(cudaFree(g_ws));
    CK(cudaMalloc(&g_ws, bytes));
    g_ws_bytes = bytes;
}

// x_lo: x's lo plane, read by the split formats (F16, BF16) only.
static void run_gemm(int fmt, const Plan& pl, const uint8_t* w, long long rb, const __half* x, const __half* x_lo,
                     long long ldx, const int* xrows, float* y, int rows, int n, int k) {
    float* partials = nullptr;
    if (pl.splits > 1) {
        ensure_ws((size_t)pl.splits * rows * n * 4);
        partials = g_ws;
    }
    const pf::GemmParams p = gemm_params(w, rb, x, x_lo, ldx, xrows, y, rows, n, k, pl.per, partials);
    const CfgInfo& c = CFG[pl.cfg];
    const int nz = (k / 64 + pl.per - 1) / pl.per;  // splits actually made (<= pl.splits)
    dim3 grid((n + c.bn - 1) / c.bn, (rows + c.bm - 1) / c.bm, nz);
    KERN[fmt][pl.cfg]<<<grid, c.nth, SMEM[fmt][pl.cfg]>>>(p);
    CKL();
    if (pl.splits > 1) {
        const long long nv = ((long long)rows * n + 3) / 4;
        pf_gemm_splitk_reduce<<<(int)std::min<long long>((nv + 255) / 256, 4096), 256>>>(pf::ReduceParams{g_ws, y, n, rows, n, nz});
        CKL();
    }
}
// y = f16(x); with lo, also the lo plane f16(x - y) (the split formats' second operand).
static void to_f16(const float* x, __half* y, long long n, __half* lo = nullptr) {
    pf_f32_to_f16<<<(int)std::min<long long>((n / 4 + 255) / 256 + 1, 8192), 256>>>(pf::CvtParams{x, y, lo, n});
    CKL();
}

// A device weight matrix [n, k] in format fmt, `copies` copies `stride` bytes apart.
struct DevW {
    uint8_t* p = nullptr;
    long long rb = 0, stride = 0, bytes = 0;
    int copies = 1;
};
static DevW make_weights(int fmt, long long n, long long k, int copies) {
    DevW w;
    w.rb = row_bytes(fmt, k);
    w.bytes = w.rb * n;
    w.stride = (w.bytes + 255) / 256 * 256;
    w.copies = copies;
    const size_t total = (size_t)w.stride * copies;
    CK(cudaMalloc(&w.p, total));
    if (fmt == F16 || fmt == BF16) {
        k_gen_f16<<<2048, 256>>>(reinterpret_cast<uint16_t*>(w.p), (long long)(total / 2), g_seed++, fmt == BF16, 0.1f);
    } else {
        gen_bytes(w.p, total);
        for (int c = 0; c < copies; c++)
            k_fix_scales<<<1024, 256>>>(fmt, w.p + (size_t)c * w.stride, n * k / FMT_QK[fmt], g_seed++);
    }
    CKL();
    return w;
}

// ---------------------------------------------------------------- GEMM correctness
// GEMM_SPLIT_EXACT: the split formats against the exact f32 operands at K = 832 (run B measured the
// tensor cores' f32 accumulation at ~1e-6 there; an f16-rounded x gives ~1.8e-4).
static const double GEMM_TIGHT = 1e-4, GEMM_TIER = 6e-3, GEMM_SPLIT_EXACT = 2e-5;
static double exact_bound(int fmt) { return split_fmt(fmt) ? GEMM_SPLIT_EXACT : GEMM_TIER; }

static void gemm_correctness() {
    LOG.line("\n== GEMM correctness: every format x tile config x split, T in {1,3,63,64,65,200,1000}, N=320 ==");
    const int N = 320, TMAX = 1000;
    const std::vector<int> Ts = g_quick ? std::vector<int>{3, 65, 200} : std::vector<int>{1, 3, 63, 64, 65, 200, 1000};
    for (int fmt = 0; fmt < NFMT; fmt++) {
        const int K = (fmt == Q80 || fmt == F16 || fmt == BF16) ? 832 : 768;  // Q8_0: a half super-step at the end
        const bool split = split_fmt(fmt);
        DevW w = make_weights(fmt, N, K, 1);
        std::vector<uint8_t> wh(w.bytes);
        CK(cudaMemcpy(wh.data(), w.p, w.bytes, cudaMemcpyDeviceToHost));
        Rng rng(100 + fmt);
        std::vector<float> x((size_t)TMAX * K);
        for (auto& v : x) v = (float)(rng.uni() * 2 - 1);
        float *dx, *dy;
        __half *dx16, *dx16lo = nullptr, *zero_lo = nullptr;
        CK(cudaMalloc(&dx, x.size() * 4));
        CK(cudaMalloc(&dx16, x.size() * 2));
        if (split) {
            CK(cudaMalloc(&dx16lo, x.size() * 2));
            CK(cudaMalloc(&zero_lo, x.size() * 2));
            CK(cudaMemset(zero_lo, 0, x.size() * 2));
        }
        CK(cudaMalloc(&dy, (size_t)TMAX * N * 4));
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        to_f16(dx, dx16, (long long)x.size(), dx16lo);
        std::vector<const float*> xr(TMAX);
        for (int t = 0; t < TMAX; t++) xr[t] = &x[(size_t)t * K];
        GemmRef ref = gemm_ref(fmt, wh, w.rb, K, xr, N);
        std::vector<float> y((size_t)TMAX * N);
        int nrun = 0, nok = 0;
        double worst_t = 0, worst_e = 0;
        for (int T : Ts)
            for (int c = 0; c < 3; c++)
                for (int s : {1, 2}) {
                    Plan pl;
                    pl.cfg = c;
                    pl.splits = s;
                    pl.per = steps_per_split(fmt, K / 64, s);
                    if ((K / 64 + pl.per - 1) / pl.per != s) continue;
                    poison(dy, (size_t)TMAX * N * 4);
                    run_gemm(fmt, pl, w.p, w.rb, dx16, dx16lo, K, nullptr, dy, T, N, K);
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(y.data(), dy, (size_t)T * N * 4, cudaMemcpyDeviceToHost));
                    Err et, ee;
                    for (int t = 0; t < T; t++)
                        for (int o = 0; o < N; o++) {
                            et.add(y[(size_t)t * N + o], ref.tight[(size_t)t * N + o]);
                            ee.add(y[(size_t)t * N + o], ref.exact[(size_t)t * N + o]);
                        }
                    et.finish();
                    ee.finish();
                    const bool ok = et.ok(GEMM_TIGHT) && ee.ok(exact_bound(fmt));
                    nrun++;
                    nok += ok;
                    worst_t = std::max(worst_t, et.nonfinite ? 1e9 : et.rel_l2);
                    worst_e = std::max(worst_e, ee.nonfinite ? 1e9 : ee.rel_l2);
                    if (!ok)
                        LOG.line("  FAIL %s %s split %d T=%d: tight relL2 %.3g maxrel %.3g nonfinite %lld | exact relL2 %.3g",
                                 FMT_NAME[fmt], CFG[c].name, s, T, et.rel_l2, et.max_rel(), et.nonfinite, ee.rel_l2);
                }
        // Row gather (LM head positions, MoE slots): 5 scattered rows, configs B and C.
        {
            const std::vector<int> rows = {999, 0, 500, 17, 63};
            int* drows;
            CK(cudaMalloc(&drows, rows.size() * 4));
            CK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
            for (int c : {1, 2}) {
                Plan pl;
                pl.cfg = c;
                pl.per = K / 64;
                poison(dy, (size_t)TMAX * N * 4);
                run_gemm(fmt, pl, w.p, w.rb, dx16, dx16lo, K, drows, dy, (int)rows.size(), N, K);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(y.data(), dy, rows.size() * N * 4, cudaMemcpyDeviceToHost));
                Err et;
                for (size_t i = 0; i < rows.size(); i++)
                    for (int o = 0; o < N; o++) et.add(y[i * N + o], ref.tight[(size_t)rows[i] * N + o]);
                et.finish();
                nrun++;
                nok += et.ok(GEMM_TIGHT);
                if (!et.ok(GEMM_TIGHT))
                    LOG.line("  FAIL %s %s gathered rows: tight relL2 %.3g nonfinite %lld", FMT_NAME[fmt], CFG[c].name,
                             et.rel_l2, et.nonfinite);
            }
            CK(cudaFree(drows));
        }
        LOG.line("  %-5s K=%d: %d/%d runs pass; worst rel L2 vs kernel-operand ref %.2e (bound %.0e), vs exact %.2e (bound %.0e)",
                 FMT_NAME[fmt], K, nok, nrun, worst_t, GEMM_TIGHT, worst_e, exact_bound(fmt));
        LOG.row("gemm-check %-5s          %3d/%3d runs  relL2 tight %.1e exact %.1e  %s", FMT_NAME[fmt], nok, nrun,
                worst_t, worst_e, pass(nok == nrun));
        // Split vs single plane: the same kernel with the lo plane zeroed computes the f16-rounded-x
        // product (tight against it); its exact error must be far above the split's, or the split
        // bound would not tell the two apart.
        if (split) {
            Plan pl;
            pl.cfg = 1;
            pl.splits = 1;
            pl.per = K / 64;
            const int T = 200;
            Err es, eu, eu_f16;
            for (int single = 0; single < 2; single++) {
                poison(dy, (size_t)TMAX * N * 4);
                run_gemm(fmt, pl, w.p, w.rb, dx16, single ? zero_lo : dx16lo, K, nullptr, dy, T, N, K);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(y.data(), dy, (size_t)T * N * 4, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < (size_t)T * N; i++) {
                    (single ? eu : es).add(y[i], ref.exact[i]);
                    if (single) eu_f16.add(y[i], ref.f16[i]);
                }
            }
            es.finish();
            eu.finish();
            eu_f16.finish();
            const bool ok = es.ok(GEMM_SPLIT_EXACT) && eu_f16.ok(GEMM_TIGHT) && eu.ok(GEMM_TIER) && !eu.ok(GEMM_SPLIT_EXACT);
            LOG.line("  %-5s B128x128 T=%d vs exact f32 operands: split (hi + lo) relL2 %.2e maxrel %.2e | single f16 plane "
                     "relL2 %.2e maxrel %.2e (vs its f16 ref %.2e)",
                     FMT_NAME[fmt], T, es.rel_l2, es.max_rel(), eu.rel_l2, eu.max_rel(), eu_f16.rel_l2);
            LOG.row("gemm-split %-5s T=%d    exact relL2 split %.1e single plane %.1e  %s", FMT_NAME[fmt], T, es.rel_l2,
                    eu.rel_l2, pass(ok));
            CK(cudaFree(dx16lo));
            CK(cudaFree(zero_lo));
        }
        CK(cudaFree(dx));
        CK(cudaFree(dx16));
        CK(cudaFree(dy));
        CK(cudaFree(w.p));
    }
}

// ---------------------------------------------------------------- GEMM timings at the 9B shapes
struct Shape {
    const char* name;
    int n, k, per_model;  // per_model: how many such products one 9B forward runs
};
// Qwen3.5-9B: 24 Gated DeltaNet layers (qkv 8192, z 4096, out 4096), 8 attention layers
// (q+gate 8192, k 1024, v 1024, o 4096), 32 FFNs (gate, up 12288; down in 12288).
static const Shape SH9B[] = {{"qkv|q 8192x4096", 8192, 4096, 32},
                             {"z|out|o 4096x4096", 4096, 4096, 56},
                             {"k|v 1024x4096", 1024, 4096, 16},
                             {"gate|up 12288x4096", 12288, 4096, 64},
                             {"down 4096x12288", 4096, 12288, 32}};
static const double GEMM_TIGHT_BIG = 3e-4;  // K up to 12288: f32 accumulation order of many terms
// The split formats at K up to 12288 against the exact operands: run B measured the single-plane
// accumulation at up to 1.4e-5 (down, T = 4096); the split's two mma per step double the chain.
static const double GEMM_SPLIT_EXACT_BIG = 1e-4;

// Sampled CPU check of y (device, rows x n, row stride n) = W x16: rows {0, 1, T/2, T-1, 4 random},
// columns all or 2048 random. x16lo (split formats): x's lo plane; x is then taken as hi + lo (exact
// in f32 for the planes pf_f32_to_f16 makes, and split again into the same planes by the ref).
static void gemm_sample_check(int fmt, const DevW& w, const __half* x16, const __half* x16lo, const int* xrows_host,
                              int rows, int n, int k, const float* y, Err& et, Err& ee) {
    Rng rng(rows * 31 + n + k + fmt);
    std::vector<int> rs = {0, std::min(1, rows - 1), rows / 2, rows - 1};
    for (int i = 0; i < 4; i++) rs.push_back((int)(rng.uni() * rows));
    std::sort(rs.begin(), rs.end());
    rs.erase(std::unique(rs.begin(), rs.end()), rs.end());
    std::vector<int> cs;
    if (n <= 4096) {
        for (int o = 0; o < n; o++) cs.push_back(o);
    } else {
        cs = {0, n - 1};
        for (int i = 0; i < 2046; i++) cs.push_back((int)(rng.uni() * n));
    }
    std::vector<uint8_t> wr(cs.size() * w.rb);
    for (size_t i = 0; i < cs.size(); i++)
        CK(cudaMemcpy(&wr[i * w.rb], w.p + (size_t)cs[i] * w.rb, w.rb, cudaMemcpyDeviceToHost));
    std::vector<std::vector<float>> xs(rs.size(), std::vector<float>(k));
    std::vector<const float*> xr;
    std::vector<__half> hb(k), lb(k);
    for (size_t i = 0; i < rs.size(); i++) {
        const int src = xrows_host ? xrows_host[rs[i]] : rs[i];
        CK(cudaMemcpy(hb.data(), x16 + (size_t)src * k, k * 2, cudaMemcpyDeviceToHost));
        if (x16lo) CK(cudaMemcpy(lb.data(), x16lo + (size_t)src * k, k * 2, cudaMemcpyDeviceToHost));
        for (int j = 0; j < k; j++) xs[i][j] = __half2float(hb[j]) + (x16lo ? __half2float(lb[j]) : 0.0f);
        xr.push_back(xs[i].data());
    }
    GemmRef ref = gemm_ref(fmt, wr, w.rb, k, xr, cs.size());
    std::vector<float> yr(n);
    for (size_t i = 0; i < rs.size(); i++) {
        CK(cudaMemcpy(yr.data(), y + (size_t)rs[i] * n, n * 4, cudaMemcpyDeviceToHost));
        for (size_t o = 0; o < cs.size(); o++) {
            et.add(yr[cs[o]], ref.tight[i * cs.size() + o]);
            ee.add(yr[cs[o]], ref.exact[i * cs.size() + o]);
        }
    }
    et.finish();
    ee.finish();
}

struct GemmBest {
    double us = 0;
    Plan pl;
};
static double g_best_us[NFMT][5][3];  // [fmt][shape][T index]

static void gemm_perf() {
    LOG.line("\n== GEMM timings, Qwen3.5-9B shapes (every tile config x split measured; 'plan' = the planner's pick) ==");
    const int Ts[3] = {102, 512, 4096};
    std::vector<int> fmts = {Q4K, Q80, Q6K, Q5K, F16, BF16};
    if (g_quick) fmts = {Q4K, Q80};
    for (int fmt : fmts) {
        for (int si = 0; si < 5; si++) {
            const Shape& sh = SH9B[si];
            const long long wbytes = row_bytes(fmt, sh.k) * sh.n;
            const int copies = (int)std::min<long long>(96, std::max<long long>(1, (200ll << 20) / wbytes + 1));
            DevW w = make_weights(fmt, sh.n, sh.k, copies);
            for (int ti = 0; ti < 3; ti++) {
                const int T = Ts[ti];
                __half *x16, *x16lo = nullptr;
                float *yp, *yc;
                CK(cudaMalloc(&x16, (size_t)T * sh.k * 2));
                CK(cudaMalloc(&yp, (size_t)T * sh.n * 4));
                CK(cudaMalloc(&yc, (size_t)T * sh.n * 4));
                if (split_fmt(fmt)) {
                    // Both planes from f32 activations, as the backend makes them.
                    float* xf;
                    CK(cudaMalloc(&xf, (size_t)T * sh.k * 4));
                    CK(cudaMalloc(&x16lo, (size_t)T * sh.k * 2));
                    k_gen_f32<<<2048, 256>>>(xf, (long long)T * sh.k, g_seed++, 1.0f);
                    to_f16(xf, x16, (long long)T * sh.k, x16lo);
                    CK(cudaFree(xf));
                } else {
                    k_gen_f16<<<2048, 256>>>(reinterpret_cast<uint16_t*>(x16), (long long)T * sh.k, g_seed++, false, 1.0f);
                }
                CKL();
                const Plan plan = plan_gemm(fmt, T, sh.n, sh.k);
                poison(yp, (size_t)T * sh.n * 4);
                run_gemm(fmt, plan, w.p, w.rb, x16, x16lo, sh.k, nullptr, yp, T, sh.n, sh.k);
                CK(cudaDeviceSynchronize());
                Err et, ee;
                gemm_sample_check(fmt, w, x16, x16lo, nullptr, T, sh.n, sh.k, yp, et, ee);
                const bool ok = et.ok(GEMM_TIGHT_BIG) && ee.ok(split_fmt(fmt) ? GEMM_SPLIT_EXACT_BIG : GEMM_TIER);
                const double flops = 2.0 * T * sh.n * sh.k;
                GemmBest best, planned;
                bool all_same = true;
                // Candidates: the plan, then every config with 1, 2, 4 (small T also 8) splits.
                std::vector<Plan> cands = {plan};
                for (int c = 0; c < 3; c++)
                    for (int s : {1, 2, 4, 8}) {
                        if ((c == 2 && T > 512) || (s == 4 && T > 512) || (s == 8 && T > 128)) continue;
                        Plan pl;
                        pl.cfg = c;
                        pl.splits = s;
                        pl.per = steps_per_split(fmt, sh.k / 64, s);
                        if ((sh.k / 64 + pl.per - 1) / pl.per != s) continue;
                        if (c == plan.cfg && s == plan.splits) continue;
                        cands.push_back(pl);
                    }
                for (const Plan& pl : cands) {
                    const int c = pl.cfg, s = pl.splits;
                    int rot = 0;
                    const double ms = time_ms([&] {
                        run_gemm(fmt, pl, w.p + (size_t)(rot++ % w.copies) * w.stride, w.rb, x16, x16lo, sh.k, nullptr,
                                 yc, T, sh.n, sh.k);
                    });
                    run_gemm(fmt, pl, w.p, w.rb, x16, x16lo, sh.k, nullptr, yc, T, sh.n, sh.k);
                    const double d = dev_maxrel_diff(yc, yp, (long long)T * sh.n);
                    if (!(d <= 1e-4)) all_same = false;
                    const double us = ms * 1e3;
                    LOG.line("  %-5s %-20s T=%4d %-9s split %d: %8.1f us %6.1f TFLOP/s  (vs plan output: %.1e)%s",
                             FMT_NAME[fmt], sh.name, T, CFG[c].name, s, us, flops / (us * 1e-6) / 1e12, d,
                             (c == plan.cfg && s == plan.splits) ? "  <- plan" : "");
                    if (best.us == 0 || us < best.us) {
                        best.us = us;
                        best.pl = pl;
                    }
                    if (c == plan.cfg && s == plan.splits) planned.us = us;
                }
                // The x conversion this product needs if the producer writes f32.
                float* xf;
                CK(cudaMalloc(&xf, (size_t)T * sh.k * 4));
                gen_bytes(xf, (size_t)T * sh.k * 4 / 8 * 8);
                const double conv_us = time_ms([&] { to_f16(xf, x16, (long long)T * sh.k, x16lo); }) * 1e3;
                CK(cudaFree(xf));
                g_best_us[fmt][si][ti] = best.us;
                LOG.line("  %-5s %-20s T=%4d check: tight relL2 %.2e maxrel %.2e, exact relL2 %.2e; all candidates agree: %s; "
                         "f32->f16 of x%s: %.1f us",
                         FMT_NAME[fmt], sh.name, T, et.rel_l2, et.max_rel(), ee.rel_l2, all_same ? "yes" : "NO",
                         x16lo ? " (hi and lo planes)" : "", conv_us);
                LOG.row("gemm %-5s %-19s T=%4d plan %s/%d %7.1f us %5.0f TF | best %s/%d %7.1f us %5.0f TF | %s",
                        FMT_NAME[fmt], sh.name, T, CFG[plan.cfg].name, plan.splits, planned.us,
                        flops / (planned.us * 1e-6) / 1e12, CFG[best.pl.cfg].name, best.pl.splits, best.us,
                        flops / (best.us * 1e-6) / 1e12, pass(ok && all_same));
                CK(cudaFree(x16));
                if (x16lo) CK(cudaFree(x16lo));
                CK(cudaFree(yp));
                CK(cudaFree(yc));
            }
            CK(cudaFree(w.p));
        }
        // The whole 9B's products per prompt, all weights in this format, best tile per shape.
        for (int ti = 0; ti < 3; ti++) {
            double us = 0, flops = 0;
            for (int si = 0; si < 5; si++) {
                us += SH9B[si].per_model * g_best_us[fmt][si][ti];
                flops += SH9B[si].per_model * 2.0 * Ts[ti] * SH9B[si].n * SH9B[si].k;
            }
            LOG.row("gemm %-5s 9B all layer GEMMs   T=%4d %8.2f ms  %5.0f TF  -> %7.0f tokens/s from the GEMMs alone",
                    FMT_NAME[fmt], Ts[ti], us / 1e3, flops / (us * 1e-6) / 1e12, Ts[ti] / (us * 1e-6));
        }
    }

    // LM head: 248320 x 4096 Q6_K, only the wanted positions (T = 1, or 16 gathered rows).
    if (!g_quick) {
        const int N = 248320, K = 4096, TX = 512;
        DevW w = make_weights(Q6K, N, K, 1);
        __half* x16;
        float* y;
        int* drows;
        CK(cudaMalloc(&x16, (size_t)TX * K * 2));
        CK(cudaMalloc(&y, (size_t)16 * N * 4));
        k_gen_f16<<<2048, 256>>>(reinterpret_cast<uint16_t*>(x16), (long long)TX * K, g_seed++, false, 1.0f);
        std::vector<int> rows(16);
        for (int i = 0; i < 16; i++) rows[i] = (i * 37 + 11) % TX;
        CK(cudaMalloc(&drows, 64));
        CK(cudaMemcpy(drows, rows.data(), 64, cudaMemcpyHostToDevice));
        for (int T : {1, 16}) {
            const Plan pl = plan_gemm(Q6K, T, N, K);
            poison(y, (size_t)T * N * 4);
            run_gemm(Q6K, pl, w.p, w.rb, x16, nullptr, K, drows, y, T, N, K);
            CK(cudaDeviceSynchronize());
            Err et, ee;
            gemm_sample_check(Q6K, w, x16, nullptr, rows.data(), T, N, K, y, et, ee);
            const double us = time_ms([&] { run_gemm(Q6K, pl, w.p, w.rb, x16, nullptr, K, drows, y, T, N, K); }) * 1e3;
            const bool ok = et.ok(GEMM_TIGHT_BIG) && ee.ok(GEMM_TIER);
            LOG.line("  LM head Q6_K 248320x4096 T=%d (gathered rows) %s/%d: %.1f us, %.0f GB/s of weights; tight relL2 %.2e exact %.2e",
                     T, CFG[pl.cfg].name, pl.splits, us, w.bytes / (us * 1e-6) / 1e9, et.rel_l2, ee.rel_l2);
            LOG.row("gemm Q6_K  LM head 248320x4096 T=%4d %s/%d %8.1f us %5.0f GB/s weights          | %s", T,
                    CFG[pl.cfg].name, pl.splits, us, w.bytes / (us * 1e-6) / 1e9, pass(ok));
        }
        CK(cudaFree(x16));
        CK(cudaFree(y));
        CK(cudaFree(drows));
        CK(cudaFree(w.p));
    }
}

// ================================================================ chunked delta rule

struct GdnDev {
    float *u = nullptr, *g = nullptr, *beta = nullptr, *state = nullptr, *out = nullptr;
    float *su = nullptr, *sw = nullptr, *sp = nullptr, *sg = nullptr;
    int T = 0, hk = 0, hv = 0;
};
static GdnDev gdn_upload(const GdnData& d) {
    GdnDev g;
    g.T = d.T;
    g.hk = d.hk;
    g.hv = d.hv;
    const int nc = (d.T + 63) / 64;
    CK(cudaMalloc(&g.u, d.u.size() * 4));
    CK(cudaMalloc(&g.g, d.g.size() * 4));
    CK(cudaMalloc(&g.beta, d.beta.size() * 4));
    CK(cudaMalloc(&g.state, d.s0.size() * 4));
    CK(cudaMalloc(&g.out, (size_t)d.T * d.hv * 128 * 4));
    CK(cudaMalloc(&g.su, (size_t)d.hv * nc * 64 * 128 * 4));
    CK(cudaMalloc(&g.sw, (size_t)d.hv * nc * 64 * 128 * 4));
    CK(cudaMalloc(&g.sp, (size_t)d.hv * nc * 64 * 64 * 4));
    CK(cudaMalloc(&g.sg, (size_t)d.hv * nc * 128 * 4));  // gamma hi, lo
    CK(cudaMemcpy(g.u, d.u.data(), d.u.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.g, d.g.data(), d.g.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.beta, d.beta.data(), d.beta.size() * 4, cudaMemcpyHostToDevice));
    return g;
}
static void gdn_free(GdnDev& g) {
    for (float* p : {g.u, g.g, g.beta, g.state, g.out, g.su, g.sw, g.sp, g.sg}) CK(cudaFree(p));
}
// Tokens [t0, t0 + T) of the uploaded prompt (the kernels see pointers offset to t0).
static void gdn_run(const GdnDev& g, bool exact, int t0, int T, int which = 3) {
    const int D = 128, cd = 2 * g.hk * D + g.hv * D;
    pf::GdnParams p{};
    p.u = g.u + (size_t)t0 * cd;
    p.g = g.g + (size_t)t0 * g.hv;
    p.beta = g.beta + (size_t)t0 * g.hv;
    p.state = g.state;
    p.out = g.out + (size_t)t0 * g.hv * D;
    p.su = g.su;
    p.sw = g.sw;
    p.sp = g.sp;
    p.sg = g.sg;
    p.T = T;
    p.hk = g.hk;
    p.hv = g.hv;
    const int nc = (T + 63) / 64;
    if (which & 1) {
        (exact ? pf_gdn_prep_exact : pf_gdn_prep_fast)<<<dim3(nc, g.hv), pf::GP_NTH, pf::GP_SMEM>>>(p);
        CKL();
    }
    if (which & 2) {
        (exact ? pf_gdn_state_exact : pf_gdn_state_fast)<<<dim3(128 / pf::GS_ROWS, g.hv), pf::GS_NTH, pf::GS_SMEM>>>(p);
        CKL();
    }
}
static void gdn_setup() {
    for (auto k : {pf_gdn_prep_exact, pf_gdn_prep_fast})
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, pf::GP_SMEM));
    for (auto k : {pf_gdn_state_exact, pf_gdn_state_fast})
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, pf::GS_SMEM));
}
// Run chunked over [0, T1) then [T1, T) (state carried on the device) and compare o and the final
// state with the f64 recurrence.
static void gdn_compare(const GdnData& d, bool exact, int T1, Err& eo, Err& es) {
    GdnDev g = gdn_upload(d);
    CK(cudaMemcpy(g.state, d.s0.data(), d.s0.size() * 4, cudaMemcpyHostToDevice));
    poison(g.out, (size_t)d.T * d.hv * 128 * 4);
    gdn_run(g, exact, 0, T1);
    if (T1 < d.T) gdn_run(g, exact, T1, d.T - T1);
    CK(cudaDeviceSynchronize());
    std::vector<float> o((size_t)d.T * d.hv * 128), st(d.s0.size());
    CK(cudaMemcpy(o.data(), g.out, o.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(st.data(), g.state, st.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> s(d.s0.begin(), d.s0.end()), ro(o.size());
    gdn_ref(d, s, 0, d.T, ro);
    for (size_t i = 0; i < o.size(); i++) eo.add(o[i], ro[i]);
    for (size_t i = 0; i < st.size(); i++) es.add(st[i], s[i]);
    eo.finish();
    es.finish();
    gdn_free(g);
}

static const double GDN_EXACT = 2e-5, GDN_FAST = 6e-3;

static void gdn_tests() {
    LOG.line("\n== chunked delta rule: vs f64 recurrence (DELTANET.md A.2), Hk=2 Hv=4, random non-symmetric S0 ==");
    int nok = 0, nrun = 0;
    double worst[2] = {0, 0};
    for (int exact = 1; exact >= 0; exact--)
        for (double c : {1.0, 20.0})
            for (int T : {1, 2, 63, 64, 65, 128, 130, 200}) {
                GdnData d = gdn_make(2, 4, T, c, 1000 + T * 3 + (int)c);
                for (int split : {0, 1}) {
                    if (split && T < 3) continue;
                    const int T1 = split ? T / 2 + 1 : T;  // prefill in two calls, state carried
                    Err eo, es;
                    gdn_compare(d, exact, T1, eo, es);
                    const double bound = exact ? GDN_EXACT : GDN_FAST;
                    const bool ok = eo.ok(bound) && es.ok(bound);
                    nrun++;
                    nok += ok;
                    worst[exact] = std::max({worst[exact], eo.nonfinite ? 1e9 : eo.rel_l2, es.nonfinite ? 1e9 : es.rel_l2});
                    if (!ok || T == 200)
                        LOG.line("  %s %s T=%d c=%g%s: out relL2 %.2e maxrel %.2e nonfinite %lld | state relL2 %.2e maxrel %.2e",
                                 ok ? "ok  " : "FAIL", exact ? "exact" : "fast", T, c, split ? " (two calls)" : "",
                                 eo.rel_l2, eo.max_rel(), eo.nonfinite, es.rel_l2, es.max_rel());
                }
            }
    LOG.line("  %d/%d pass; worst rel L2 exact (3xTF32) %.2e (bound %.0e), fast (1xTF32) %.2e (bound %.0e)", nok, nrun,
             worst[1], GDN_EXACT, worst[0], GDN_FAST);
    LOG.row("delta-check Hk2/Hv4      %3d/%3d runs  relL2 exact %.1e fast %.1e  %s", nok, nrun, worst[1], worst[0],
            pass(nok == nrun));

    if (!g_perf) return;
    LOG.line("\n== chunked delta rule, Qwen3.5-9B layer (Hk=16, Hv=32, dk=dv=128) ==");
    for (int T : {102, 512, 4096}) {
        GdnData d = gdn_make(16, 32, T, 1.0, 77 + T);
        for (int exact = 1; exact >= 0; exact--) {
            Err eo, es;
            gdn_compare(d, exact, T, eo, es);
            GdnDev g = gdn_upload(d);
            CK(cudaMemcpy(g.state, d.s0.data(), d.s0.size() * 4, cudaMemcpyHostToDevice));
            const double t_prep = time_ms([&] { gdn_run(g, exact, 0, T, 1); }) * 1e3;
            const double t_state = time_ms([&] { gdn_run(g, exact, 0, T, 2); }) * 1e3;
            const double t_all = time_ms([&] { gdn_run(g, exact, 0, T, 3); }) * 1e3;
            gdn_free(g);
            const double bound = exact ? GDN_EXACT : GDN_FAST;
            const bool ok = eo.ok(bound) && es.ok(bound);
            LOG.line("  T=%4d %s: prep %.1f us + state pass %.1f us = %.1f us per layer (target < 150 us at T=512); "
                     "out relL2 %.2e state relL2 %.2e",
                     T, exact ? "exact" : "fast ", t_prep, t_state, t_all, eo.rel_l2, es.rel_l2);
            LOG.row("delta %s 9B layer      T=%4d %7.1f us (prep %6.1f + state %6.1f)  relL2 %.1e     | %s",
                    exact ? "exact" : "fast ", T, t_all, t_prep, t_state, std::max(eo.rel_l2, es.rel_l2), pass(ok));
        }
    }
}

// ================================================================ flash attention

static void attn_setup() {
    CK(cudaFuncSetAttribute(pf_flash_attn_d256, cudaFuncAttributeMaxDynamicSharedMemorySize, pf::FA_SMEM));
}
struct AttnCase {
    int H, Hkv, T, pos0;
};
// Runs one case; checks `nsample` query rows (all if 0) against f64; returns the median time (us)
// when `timed`.
static double attn_case(const AttnCase& a, int nsample, bool timed, Err& err) {
    const int D = 256, kv_len = a.pos0 + a.T, ctx = kv_len + 3;
    const float scale = 1.0f / 16.0f;
    Rng rng(a.T * 131 + a.pos0 + a.H);
    std::vector<float> q((size_t)a.T * a.H * D), kc((size_t)ctx * a.Hkv * D), vc(kc.size());
    for (auto& v : q) v = (float)rng.normal();
    for (size_t i = 0; i < kc.size(); i++) {
        const bool live = i < (size_t)kv_len * a.Hkv * D;  // rows past the prompt: NaN (must not be read)
        kc[i] = live ? (float)rng.normal() : NAN;
        vc[i] = live ? (float)rng.normal() : NAN;
    }
    float *dq, *dk, *dv, *dout;
    __half *dk16, *dv16;
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMalloc(&dk, kc.size() * 4));
    CK(cudaMalloc(&dv, vc.size() * 4));
    CK(cudaMalloc(&dk16, kc.size() * 2));
    CK(cudaMalloc(&dv16, vc.size() * 2));
    CK(cudaMalloc(&dout, q.size() * 4));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, kc.data(), kc.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, vc.data(), vc.size() * 4, cudaMemcpyHostToDevice));
    to_f16(dk, dk16, (long long)kc.size());
    to_f16(dv, dv16, (long long)vc.size());
    pf::FlashParams p{dq, dk16, dv16, dout, a.T, a.pos0, a.H, a.Hkv, scale * 1.4426950408889634f};
    auto launch = [&] {
        pf_flash_attn_d256<<<dim3((a.T + pf::FA_BQ - 1) / pf::FA_BQ, a.H), pf::FA_NTH, pf::FA_SMEM>>>(p);
        CKL();
    };
    poison(dout, q.size() * 4);
    launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> o(q.size());
    CK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<int> ts;
    if (nsample == 0 || nsample >= a.T) {
        for (int t = 0; t < a.T; t++) ts.push_back(t);
    } else {
        ts = {0, a.T - 1, a.T / 2, std::min(63, a.T - 1), std::min(64, a.T - 1)};
        for (int i = 0; i < nsample; i++) ts.push_back((int)(rng.uni() * a.T));
    }
    const std::vector<double> ref = attn_ref(q, kc, vc, a.H, a.Hkv, D, a.pos0, scale, ts);
    for (size_t i = 0; i < ts.size(); i++)
        for (int h = 0; h < a.H; h++)
            for (int e = 0; e < D; e++)
                err.add(o[((size_t)ts[i] * a.H + h) * D + e], ref[(i * a.H + h) * D + e]);
    err.finish();
    double us = 0;
    if (timed) us = time_ms(launch) * 1e3;
    for (void* ptr : {(void*)dq, (void*)dk, (void*)dv, (void*)dk16, (void*)dv16, (void*)dout}) CK(cudaFree(ptr));
    return us;
}

static const double ATTN_BOUND = 2e-3;

static void attn_tests() {
    LOG.line("\n== flash attention (causal GQA, D=256) vs f64 softmax attention; cache rows past the prompt are NaN ==");
    int nok = 0, nrun = 0;
    double worst = 0;
    const AttnCase cases[] = {{4, 2, 1, 0},   {4, 2, 1, 100},  {4, 2, 3, 5},    {4, 2, 64, 0},  {4, 2, 65, 0},
                              {4, 2, 200, 0}, {4, 2, 100, 37}, {4, 2, 64, 64}, {4, 2, 130, 190}, {8, 1, 70, 3}};
    for (const AttnCase& a : cases) {
        Err e;
        attn_case(a, 0, false, e);
        const bool ok = e.ok(ATTN_BOUND);
        nrun++;
        nok += ok;
        worst = std::max(worst, e.nonfinite ? 1e9 : e.rel_l2);
        LOG.line("  %s H=%d Hkv=%d T=%d pos0=%d: relL2 %.2e maxrel %.2e nonfinite %lld", ok ? "ok  " : "FAIL", a.H, a.Hkv,
                 a.T, a.pos0, e.rel_l2, e.max_rel(), e.nonfinite);
    }
    LOG.row("attn-check               %3d/%3d runs  relL2 %.1e (bound %.0e)        %s", nok, nrun, worst, ATTN_BOUND,
            pass(nok == nrun));
    if (!g_perf) return;
    LOG.line("\n== flash attention, Qwen3.5-9B layer (16 query heads, 4 KV heads) ==");
    const AttnCase perf[] = {{16, 4, 102, 0}, {16, 4, 512, 0}, {16, 4, 4096, 0}, {16, 4, 512, 3584}};
    for (const AttnCase& a : perf) {
        Err e;
        const double us = attn_case(a, 24, true, e);
        double pairs = 0;
        for (int t = 0; t < a.T; t++) pairs += a.pos0 + t + 1;
        const double flops = 4.0 * 256 * a.H * pairs;
        const bool ok = e.ok(ATTN_BOUND);
        LOG.line("  T=%4d pos0=%4d: %.1f us, %.0f TFLOP/s (causal), relL2 %.2e (sampled rows)", a.T, a.pos0, us,
                 flops / (us * 1e-6) / 1e12, e.rel_l2);
        LOG.row("attn 9B layer  T=%4d pos0=%4d %8.1f us %5.0f TF  relL2 %.1e              | %s", a.T, a.pos0, us,
                flops / (us * 1e-6) / 1e12, e.rel_l2, pass(ok));
    }
}

// ================================================================ MoE grouped prefill

struct MoeDev {
    int *counts, *offsets, *ntiles, *slot_token, *slot_of;
    int4* tiles;
    float *G, *U, *D;
    __half *H, *Hlo;  // h and its lo plane (down experts of a split format)
};
struct MoeShape {
    int T, k, E, d, nff;
};
static int moe_cfg(const MoeShape& s) { return (long long)s.T * s.k / s.E >= 96 ? 1 : 2; }  // B (128 rows) or C (32)
static int moe_max_tiles(const MoeShape& s) {
    const int bm = CFG[moe_cfg(s)].bm;
    return (s.T * s.k + bm - 1) / bm + s.E;
}
static MoeDev moe_alloc(const MoeShape& s) {
    MoeDev m;
    const long long S = (long long)s.T * s.k;
    CK(cudaMalloc(&m.counts, s.E * 4));
    CK(cudaMalloc(&m.offsets, (s.E + 1) * 4));
    CK(cudaMalloc(&m.ntiles, 4));
    CK(cudaMalloc(&m.slot_token, S * 4));
    CK(cudaMalloc(&m.slot_of, S * 4));
    CK(cudaMalloc(&m.tiles, (size_t)moe_max_tiles(s) * sizeof(int4)));
    CK(cudaMalloc(&m.G, S * s.nff * 4));
    CK(cudaMalloc(&m.U, S * s.nff * 4));
    CK(cudaMalloc(&m.D, S * s.d * 4));
    CK(cudaMalloc(&m.H, S * s.nff * 2));
    CK(cudaMalloc(&m.Hlo, S * s.nff * 2));
    return m;
}
static void moe_free(MoeDev& m) {
    for (void* p : {(void*)m.counts, (void*)m.offsets, (void*)m.ntiles, (void*)m.slot_token, (void*)m.slot_of,
                    (void*)m.tiles, (void*)m.G, (void*)m.U, (void*)m.D, (void*)m.H, (void*)m.Hlo})
        CK(cudaFree(p));
}
// x_lo: x's lo plane, gathered like x (split formats only).
static void grouped_gemm(int fmt, int cfg, const DevW& w, long long expert_bytes, const __half* x, const __half* x_lo,
                         long long ldx, const int* xrows, float* y, const MoeDev& m, int max_tiles, int n, int k) {
    const pf::GemmParams p =
        grouped_params(w.p, w.rb, expert_bytes, x, split_fmt(fmt) ? x_lo : nullptr, ldx, xrows, y, n, k, m.tiles, m.ntiles);
    dim3 grid((n + CFG[cfg].bn - 1) / CFG[cfg].bn, max_tiles, 1);
    KERN[fmt][cfg]<<<grid, CFG[cfg].nth, SMEM[fmt][cfg]>>>(p);
    CKL();
}
// The routed experts of one MoE layer: group, gate/up grouped GEMMs, SwiGLU, down, combine.
// stage: 1 = grouping only, 2 = + gate/up, 3 = everything.
static void moe_forward(const MoeShape& s, int fmt_gu, int fmt_d, const DevW& wg, const DevW& wu, const DevW& wd,
                        const __half* x16, const __half* x16lo, const uint32_t* ids, const float* wts, float* out,
                        const MoeDev& m, int stage = 3) {
    const int S = s.T * s.k, cfg = moe_cfg(s), mt = moe_max_tiles(s);
    CK(cudaMemsetAsync(m.counts, 0, s.E * 4));
    pf::MoeParams mp{ids, m.counts, m.offsets, m.tiles, m.ntiles, m.slot_token, m.slot_of, m.D, wts, out,
                     S, s.E, s.k, CFG[cfg].bm, s.d};
    pf_moe_count<<<(S + 255) / 256, 256>>>(mp);
    pf_moe_offsets<<<1, 1024>>>(mp);
    pf_moe_place<<<s.E, 256>>>(mp);
    CKL();
    if (stage < 2) return;
    grouped_gemm(fmt_gu, cfg, wg, (long long)s.nff * wg.rb, x16, x16lo, s.d, m.slot_token, m.G, m, mt, s.nff, s.d);
    grouped_gemm(fmt_gu, cfg, wu, (long long)s.nff * wu.rb, x16, x16lo, s.d, m.slot_token, m.U, m, mt, s.nff, s.d);
    if (stage < 3) return;
    __half* hlo = split_fmt(fmt_d) ? m.Hlo : nullptr;
    pf_swiglu_f16<<<2048, 256>>>(pf::SwigluParams{m.G, m.U, m.H, hlo, nullptr, (long long)S * s.nff});
    grouped_gemm(fmt_d, cfg, wd, (long long)s.d * wd.rb, m.H, hlo, s.nff, nullptr, m.D, m, mt, s.d, s.nff);
    pf_moe_combine<<<s.T, 256>>>(mp);
    CKL();
}

static void moe_case(const MoeShape& s, int fmt_gu, int fmt_d, bool timed, int nsample) {
    Rng rng(s.T * 7 + s.E);
    const int S = s.T * s.k;
    std::vector<uint32_t> ids(S);
    std::vector<float> wts(S);
    std::vector<int> perm(s.E);
    for (int t = 0; t < s.T; t++) {
        for (int e = 0; e < s.E; e++) perm[e] = e;
        float sum = 0;
        for (int j = 0; j < s.k; j++) {
            const int r = j + (int)(rng.uni() * (s.E - j));
            std::swap(perm[j], perm[r]);
            ids[t * s.k + j] = perm[j];
            sum += (wts[t * s.k + j] = (float)(0.1 + rng.uni()));
        }
        for (int j = 0; j < s.k; j++) wts[t * s.k + j] /= sum;
    }
    // Experts stacked [E, rows, cols] like the GGUF 3-D tensors.
    DevW wg = make_weights(fmt_gu, (long long)s.E * s.nff, s.d, 1);
    DevW wu = make_weights(fmt_gu, (long long)s.E * s.nff, s.d, 1);
    DevW wd = make_weights(fmt_d, (long long)s.E * s.d, s.nff, 1);
    // x in f32, both f16 planes made from it as the backend makes them.
    __half *x16, *x16lo;
    uint32_t* dids;
    float *dw, *dout, *dxf;
    CK(cudaMalloc(&x16, (size_t)s.T * s.d * 2));
    CK(cudaMalloc(&x16lo, (size_t)s.T * s.d * 2));
    CK(cudaMalloc(&dxf, (size_t)s.T * s.d * 4));
    CK(cudaMalloc(&dids, S * 4));
    CK(cudaMalloc(&dw, S * 4));
    CK(cudaMalloc(&dout, (size_t)s.T * s.d * 4));
    k_gen_f32<<<1024, 256>>>(dxf, (long long)s.T * s.d, g_seed++, 1.0f);
    to_f16(dxf, x16, (long long)s.T * s.d, x16lo);
    CK(cudaMemcpy(dids, ids.data(), S * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, wts.data(), S * 4, cudaMemcpyHostToDevice));
    MoeDev m = moe_alloc(s);
    poison(dout, (size_t)s.T * s.d * 4);
    poison(m.slot_of, S * 4);
    moe_forward(s, fmt_gu, fmt_d, wg, wu, wd, x16, x16lo, dids, dw, dout, m);
    CK(cudaDeviceSynchronize());

    // Grouping invariants.
    std::vector<int> slot_token(S), slot_of(S), offsets(s.E + 1);
    CK(cudaMemcpy(slot_token.data(), m.slot_token, S * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(slot_of.data(), m.slot_of, S * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(offsets.data(), m.offsets, (s.E + 1) * 4, cudaMemcpyDeviceToHost));
    bool group_ok = offsets[0] == 0 && offsets[s.E] == S;
    std::vector<int> seen(S, 0);
    for (int i = 0; i < S && group_ok; i++) {
        const int sl = slot_of[i], e = ids[i];
        group_ok = sl >= offsets[e] && sl < offsets[e + 1] && slot_token[sl] == i / s.k && !seen[sl]++;
    }
    for (int e = 0; e < s.E && group_ok; e++)
        for (int sl = offsets[e] + 1; sl < offsets[e + 1]; sl++) group_ok &= slot_token[sl - 1] < slot_token[sl];

    // Reference for sampled tokens: tight (the operands as the kernels read them) and exact.
    std::vector<int> ts;
    if (nsample == 0 || nsample >= s.T) {
        for (int t = 0; t < s.T; t++) ts.push_back(t);
    } else {
        ts = {0, s.T - 1};
        for (int i = 0; i < nsample; i++) ts.push_back((int)(rng.uni() * s.T));
    }
    std::vector<float> out((size_t)s.T * s.d);
    CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<uint8_t> hg(wg.bytes), hu(wu.bytes), hd(wd.bytes);
    CK(cudaMemcpy(hg.data(), wg.p, wg.bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hu.data(), wu.p, wu.bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hd.data(), wd.p, wd.bytes, cudaMemcpyDeviceToHost));
    std::vector<float> xf((size_t)s.T * s.d);
    CK(cudaMemcpy(xf.data(), dxf, xf.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> rt, re;
    moe_ref(fmt_gu, fmt_d, hg.data(), hu.data(), hd.data(), wg.rb, wd.rb, xf, ids, wts, s.k, s.d, s.nff, ts, rt, re);
    Err et, ee;
    for (size_t i = 0; i < ts.size(); i++)
        for (int o = 0; o < s.d; o++) {
            et.add(out[(size_t)ts[i] * s.d + o], rt[i * s.d + o]);
            ee.add(out[(size_t)ts[i] * s.d + o], re[i * s.d + o]);
        }
    et.finish();
    ee.finish();
    // Experts all of a split format are f32-class end to end.
    const bool all_split = split_fmt(fmt_gu) && split_fmt(fmt_d);
    const bool ok = group_ok && et.ok(all_split ? 2e-5 : 5e-4) && ee.ok(all_split ? GEMM_SPLIT_EXACT : GEMM_TIER);
    LOG.line("  MoE T=%d E=%d k=%d d=%d n_ff=%d %s/%s (%s): grouping %s, tight relL2 %.2e maxrel %.2e, exact relL2 %.2e",
             s.T, s.E, s.k, s.d, s.nff, FMT_NAME[fmt_gu], FMT_NAME[fmt_d], CFG[moe_cfg(s)].name,
             group_ok ? "consistent" : "BROKEN", et.rel_l2, et.max_rel(), ee.rel_l2);
    if (timed) {
        const double t_group =
            time_ms([&] { moe_forward(s, fmt_gu, fmt_d, wg, wu, wd, x16, x16lo, dids, dw, dout, m, 1); }) * 1e3;
        const double t_gu = time_ms([&] { moe_forward(s, fmt_gu, fmt_d, wg, wu, wd, x16, x16lo, dids, dw, dout, m, 2); }) * 1e3;
        const double t_all =
            time_ms([&] { moe_forward(s, fmt_gu, fmt_d, wg, wu, wd, x16, x16lo, dids, dw, dout, m, 3); }) * 1e3;
        const double flops = 2.0 * S * 3.0 * s.d * s.nff;
        const double wbytes = (double)wg.bytes + wu.bytes + wd.bytes;
        LOG.line("    grouping %.1f us, + gate/up %.1f us, whole layer %.1f us: %.0f TFLOP/s useful, %.0f GB/s of expert weights",
                 t_group, t_gu, t_all, flops / (t_all * 1e-6) / 1e12, wbytes / (t_all * 1e-6) / 1e9);
        LOG.row("moe 35B-A3B experts T=%4d %s %8.1f us (group %5.1f) %5.0f TF %5.0f GB/s     | %s", s.T, FMT_NAME[fmt_gu],
                t_all, t_group, flops / (t_all * 1e-6) / 1e12, wbytes / (t_all * 1e-6) / 1e9, pass(ok));
    } else {
        LOG.row("moe-check T=%d E=%d %-5s/%-5s grouping %s relL2 tight %.1e exact %.1e  %s", s.T, s.E, FMT_NAME[fmt_gu],
                FMT_NAME[fmt_d], group_ok ? "ok" : "BROKEN", et.rel_l2, ee.rel_l2, pass(ok));
    }
    moe_free(m);
    for (void* p : {(void*)x16, (void*)x16lo, (void*)dxf, (void*)dids, (void*)dw, (void*)dout, (void*)wg.p, (void*)wu.p,
                    (void*)wd.p})
        CK(cudaFree(p));
}

static void moe_tests() {
    LOG.line("\n== MoE prefill: grouping + grouped GEMMs vs per-token CPU reference ==");
    moe_case({100, 4, 16, 512, 256}, Q4K, Q4K, false, 0);
    moe_case({100, 4, 16, 512, 256}, Q80, Q6K, false, 0);
    moe_case({600, 4, 16, 512, 256}, Q5K, Q80, false, 24);  // 150 rows per expert: tile config B
    moe_case({100, 4, 16, 512, 256}, F16, F16, false, 0);   // split: lo planes gathered and written
    moe_case({600, 4, 16, 512, 256}, BF16, F16, false, 24);
    if (!g_perf) return;
    LOG.line("\n== MoE prefill, Qwen3.5-35B-A3B layer (256 experts, top-8, d=2048, n_ff=512) ==");
    moe_case({512, 8, 256, 2048, 512}, Q4K, Q4K, true, 4);
    if (!g_quick) moe_case({4096, 8, 256, 2048, 512}, Q4K, Q4K, true, 4);
}

// ================================================================ ceilings

static void ceilings() {
    LOG.line("\n== ceilings of this card ==");
    float* dummy;
    CK(cudaMalloc(&dummy, 4));
    const int iters = 4096, blocks = g_sms * 8;
    const double ms = time_ms([&] { k_mma_peak<<<blocks, 256>>>(dummy, iters); }, 2, 7);
    const double tf = (double)blocks * 8 * iters * 8 * 4096.0 / (ms * 1e-3) / 1e12;
    CK(cudaFree(dummy));
    const size_t bytes = 2ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    const double cms = time_ms([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 2, 7);
    CK(cudaFree(a));
    CK(cudaFree(b));
    LOG.line("  mma.sync m16n8k16 f16->f32 (registers only): %.0f TFLOP/s; device copy: %.0f GB/s (read + write)", tf,
             2.0 * bytes / (cms * 1e-3) / 1e9);
    LOG.row("ceiling mma.sync %.0f TFLOP/s, copy %.0f GB/s", tf, 2.0 * bytes / (cms * 1e-3) / 1e9);
}

// ================================================================ main

int main(int argc, char** argv) {
    std::string what = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = true;
        else what = argv[i];
    }
    const char* out = getenv("OUT");
    LOG.open(out && *out ? out : ".");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    LOG.line("device %s, %d SMs, L2 %d MB, smem/block opt-in %zu KB, cc %d.%d", prop.name, g_sms,
             prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10, prop.major, prop.minor);
    gemm_setup();
    gdn_setup();
    attn_setup();
    const bool checks = what == "checks", all = what == "all" || checks;
    g_perf = !checks;
    if ((all && !checks) || what == "peak") ceilings();
    if (all || what == "gemm") gemm_correctness();
    if (all || what == "delta") gdn_tests();
    if (all || what == "attn") attn_tests();
    if (all || what == "moe") moe_tests();
    if ((all && !checks) || what == "gemm") gemm_perf();
    CK(cudaDeviceSynchronize());
    printf("\n================ summary (%s) ================\n", g_fail ? "FAILURES" : "all checks pass");
    for (auto& r : LOG.table) printf("%s\n", r.c_str());
    printf("%d failed checks\n", g_fail);
    return g_fail ? 1 : 0;
}
