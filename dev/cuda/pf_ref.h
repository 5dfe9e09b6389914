// pf_ref.h: CPU references of the prefill harness (prefill_bench.cu on the GPU, emu/emu_checks.cpp
// on the CPU emulator): random numbers, the exact CPU dequantization of src/quant (operation
// order of ggml's dequantize_row_*; build with -ffp-contract=off so that no FMA changes a
// rounding), f64 references of the GEMM, the delta rule, attention and the MoE experts, error
// metrics and a thread pool. No CUDA runtime calls.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace host {

// ---------------------------------------------------------------- random numbers
static inline uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(mix64(seed)) {}
    uint64_t next() { return s = mix64(s); }
    double uni() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
    double normal() {
        double u1 = uni(), u2 = uni();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

// ---------------------------------------------------------------- f16 / bf16
static inline float h2f(uint16_t bits) {
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
}
static inline float round_h(float v) { return __half2float(__float2half_rn(v)); }
static inline float bf2f(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// ---------------------------------------------------------------- formats (host view)
enum { Q4K = 0, Q5K = 1, Q6K = 2, Q80 = 3, F16 = 4, BF16 = 5, NFMT = 6 };
static const char* FMT_NAME[NFMT] = {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16"};
static const int FMT_QK[NFMT] = {256, 256, 256, 32, 1, 1};
static const int FMT_BYTES[NFMT] = {144, 176, 210, 34, 2, 2};
static inline long long row_bytes(int fmt, long long k) { return k / FMT_QK[fmt] * FMT_BYTES[fmt]; }

// gemm_q.cu's FmtInfo::SPLIT: products with F16/BF16 weights read x as two f16 planes, hi = f16(x)
// and lo = f16(x - hi), and multiply both; the others read hi only.
static inline bool split_fmt(int fmt) { return fmt == F16 || fmt == BF16; }
// The activation value a product with weights of format fmt multiplies for x (hi + lo is exact in
// double).
static inline double x_as_seen(int fmt, float x) {
    const float hi = round_h(x);
    return split_fmt(fmt) ? (double)hi + round_h(x - hi) : hi;
}

static inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
static void deq_q4k(const uint8_t* b, float* y) {
    const float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
    const uint8_t* sc = b + 4;
    const uint8_t* qs = b + 16;
    for (int c = 0; c < 4; c++) {
        uint8_t s1, m1, s2, m2;
        scale_min_k4(2 * c, sc, s1, m1);
        scale_min_k4(2 * c + 1, sc, s2, m2);
        const float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
        for (int l = 0; l < 32; l++) {
            const uint8_t q = qs[32 * c + l];
            y[64 * c + l] = d1 * static_cast<float>(q & 0xf) - mm1;
            y[64 * c + 32 + l] = d2 * static_cast<float>(q >> 4) - mm2;
        }
    }
}
static void deq_q5k(const uint8_t* b, float* y) {
    const float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
    const uint8_t* sc = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int c = 0; c < 4; c++) {
        uint8_t s1, m1, s2, m2;
        scale_min_k4(2 * c, sc, s1, m1);
        scale_min_k4(2 * c + 1, sc, s2, m2);
        const float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
        for (int l = 0; l < 32; l++) {
            const uint8_t q = qs[32 * c + l];
            const uint8_t h = qh[l] >> (2 * c);
            const int lo = (q & 0xf) | ((h & 1) << 4);
            const int hi = (q >> 4) | (((h >> 1) & 1) << 4);
            y[64 * c + l] = d1 * static_cast<float>(lo) - mm1;
            y[64 * c + 32 + l] = d2 * static_cast<float>(hi) - mm2;
        }
    }
}
static void deq_q6k(const uint8_t* b, float* y) {
    const float d = h2f(rd16(b + 208));
    for (int h = 0; h < 2; h++) {
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
        float* yy = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
            yy[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
            yy[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
            yy[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
    }
}
static void deq_q80(const uint8_t* b, float* y) {
    const float d = h2f(rd16(b));
    for (int j = 0; j < 32; j++) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}
// One row of k elements.
static void deq_row(int fmt, const uint8_t* row, long long k, float* y) {
    switch (fmt) {
        case Q4K: for (long long i = 0; i < k / 256; i++) deq_q4k(row + 144 * i, y + 256 * i); break;
        case Q5K: for (long long i = 0; i < k / 256; i++) deq_q5k(row + 176 * i, y + 256 * i); break;
        case Q6K: for (long long i = 0; i < k / 256; i++) deq_q6k(row + 210 * i, y + 256 * i); break;
        case Q80: for (long long i = 0; i < k / 32; i++) deq_q80(row + 34 * i, y + 32 * i); break;
        case F16: for (long long i = 0; i < k; i++) y[i] = h2f(rd16(row + 2 * i)); break;
        case BF16: for (long long i = 0; i < k; i++) y[i] = bf2f(rd16(row + 2 * i)); break;
    }
}

// ---------------------------------------------------------------- threads
static inline int n_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 4 : static_cast<int>(std::min(n, 64u));
}
// fn(i) for i in [0, n), spread over the cores (dynamic chunks of one).
static void parallel_for(long long n, const std::function<void(long long)>& fn) {
    const int nt = static_cast<int>(std::min<long long>(n_threads(), n));
    if (nt <= 1) {
        for (long long i = 0; i < n; i++) fn(i);
        return;
    }
    std::atomic<long long> next(0);
    std::vector<std::thread> th;
    for (int t = 0; t < nt; t++)
        th.emplace_back([&] {
            for (long long i; (i = next.fetch_add(1)) < n;) fn(i);
        });
    for (auto& t : th) t.join();
}

// ---------------------------------------------------------------- metrics
struct Err {
    double rel_l2 = 0, max_abs = 0, ref_max = 0;
    long long nonfinite = 0, n = 0;
    void add(double got, double ref) {
        n++;
        if (!std::isfinite(got)) {
            nonfinite++;
            return;
        }
        const double d = got - ref;
        num += d * d;
        den += ref * ref;
        max_abs = std::max(max_abs, std::fabs(d));
        ref_max = std::max(ref_max, std::fabs(ref));
    }
    void finish() { rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
    // max |err| relative to the largest reference magnitude: catches a few wrong elements that a
    // norm over many would dilute.
    double max_rel() const { return ref_max > 0 ? max_abs / ref_max : max_abs; }
    bool ok(double bound) const { return nonfinite == 0 && n > 0 && rel_l2 <= bound && max_rel() <= 4 * bound + 1e-7; }
    double num = 0, den = 0;
};

// ---------------------------------------------------------------- references
// CPU reference of y[t][o] for t in rws, o in cols: exact (f32 dequant, x as given), tight (what
// the tensor cores multiply: weights rounded to f16, x as `x_as_seen`: f16, or hi + lo for the
// split formats) and f16 (weights and x rounded to f16: the single-plane product; equal to tight
// for the quantized formats). xrow(t) gives x row t (f32).
struct GemmRef {
    std::vector<double> exact, tight, f16;  // [rws.size()][cols.size()]
};
static GemmRef gemm_ref(int fmt, const std::vector<uint8_t>& wrows /* cols.size() rows */, long long rb, int k,
                        const std::vector<const float*>& xr, size_t ncols) {
    GemmRef r;
    const size_t nr = xr.size();
    r.exact.assign(nr * ncols, 0.0);
    r.tight.assign(nr * ncols, 0.0);
    r.f16.assign(nr * ncols, 0.0);
    std::vector<std::vector<float>> xh(nr, std::vector<float>(k));
    std::vector<std::vector<double>> xs(nr, std::vector<double>(k));
    for (size_t i = 0; i < nr; i++)
        for (int j = 0; j < k; j++) {
            xh[i][j] = round_h(xr[i][j]);
            xs[i][j] = x_as_seen(fmt, xr[i][j]);
        }
    parallel_for((long long)ncols, [&](long long o) {
        std::vector<float> w(k), wh(k);
        deq_row(fmt, wrows.data() + o * rb, k, w.data());
        for (int j = 0; j < k; j++) wh[j] = round_h(w[j]);
        for (size_t i = 0; i < nr; i++) {
            double se = 0, st = 0, sh = 0;
            for (int j = 0; j < k; j++) {
                se += (double)w[j] * xr[i][j];
                st += (double)wh[j] * xs[i][j];
                sh += (double)wh[j] * xh[i][j];
            }
            r.exact[i * ncols + o] = se;
            r.tight[i * ncols + o] = st;
            r.f16[i * ncols + o] = sh;
        }
    });
    return r;
}

struct GdnData {
    int hk, hv, T;
    std::vector<float> u, g, beta, s0;
};
static GdnData gdn_make(int hk, int hv, int T, double c, uint64_t seed) {
    GdnData d{hk, hv, T, {}, {}, {}, {}};
    const int D = 128, kd = hk * D, cd = 2 * kd + hv * D;
    Rng rng(seed);
    d.u.resize((size_t)T * cd);
    for (int t = 0; t < T; t++) {
        float* row = &d.u[(size_t)t * cd];
        for (int h = 0; h < 2 * hk; h++) {  // q heads then k heads: L2-normalised, q scaled
            double ss = 0;
            for (int i = 0; i < D; i++) {
                row[h * D + i] = (float)rng.normal();
                ss += (double)row[h * D + i] * row[h * D + i];
            }
            const float inv = (float)(1.0 / std::sqrt(ss + 1e-6)) * (h < hk ? (float)(1.0 / std::sqrt(128.0)) : 1.0f);
            for (int i = 0; i < D; i++) row[h * D + i] *= inv;
        }
        for (int i = 2 * kd; i < cd; i++) row[i] = (float)rng.normal();
    }
    d.g.resize((size_t)T * hv);
    d.beta.resize((size_t)T * hv);
    for (auto& v : d.g) v = (float)(-std::fabs(rng.normal()) * c);
    for (auto& v : d.beta) v = (float)(1.0 / (1.0 + std::exp(-rng.normal())));
    d.s0.resize((size_t)hv * D * D);
    for (auto& v : d.s0) v = (float)(rng.normal() * 0.1);
    return d;
}
// spec/DELTANET.md A.2 in f64 (value-major M), from state s (updated), over tokens [t0, t1).
static void gdn_ref(const GdnData& d, std::vector<double>& s, int t0, int t1, std::vector<double>& out) {
    const int D = 128, kd = d.hk * D, cd = 2 * kd + d.hv * D;
    parallel_for(d.hv, [&](long long j) {
        const int kh = (int)j % d.hk;
        double* M = &s[(size_t)j * D * D];
        for (int t = t0; t < t1; t++) {
            const float* row = &d.u[(size_t)t * cd];
            const float *q = row + kh * D, *k = row + kd + kh * D, *v = row + 2 * kd + j * D;
            const double decay = std::exp((double)d.g[(size_t)t * d.hv + j]), b = d.beta[(size_t)t * d.hv + j];
            for (int c = 0; c < D; c++) {
                double* m = M + c * D;
                double pred = 0;
                for (int i = 0; i < D; i++) pred += m[i] * k[i];
                const double delta = b * (v[c] - decay * pred);
                double o = 0;
                for (int i = 0; i < D; i++) {
                    m[i] = decay * m[i] + delta * k[i];
                    o += m[i] * q[i];
                }
                out[(size_t)t * d.hv * D + j * D + c] = o;
            }
        }
    });
}


// Causal GQA softmax attention in f64 for query rows `ts`: q [T, H*D], caches [ctx, Hkv*D] f32.
// Returns [ts.size()][H][D].
static std::vector<double> attn_ref(const std::vector<float>& q, const std::vector<float>& kc,
                                    const std::vector<float>& vc, int H, int Hkv, int D, int pos0, double scale,
                                    const std::vector<int>& ts) {
    std::vector<double> ref(ts.size() * H * D);
    parallel_for((long long)ts.size() * H, [&](long long idx) {
        const int t = ts[idx / H], h = (int)(idx % H), kvh = h / (H / Hkv), n = pos0 + t + 1;
        const float* qh = &q[((size_t)t * H + h) * D];
        std::vector<double> s(n);
        double mx = -1e300;
        for (int j = 0; j < n; j++) {
            const float* kr = &kc[((size_t)j * Hkv + kvh) * D];
            double acc = 0;
            for (int i = 0; i < D; i++) acc += (double)qh[i] * kr[i];
            s[j] = acc * scale;
            mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < n; j++) sum += (s[j] = std::exp(s[j] - mx));
        double* r = &ref[(size_t)idx * D];
        for (int i = 0; i < D; i++) r[i] = 0;
        for (int j = 0; j < n; j++) {
            const float* vr = &vc[((size_t)j * Hkv + kvh) * D];
            for (int i = 0; i < D; i++) r[i] += s[j] / sum * vr[i];
        }
    });
    return ref;
}

// Routed experts for tokens `ts`: out[t] = sum_j w[t][j] down_e(silu(gate_e x) * up_e x), with the
// experts' weights in host memory ([E, rows, cols] in their formats) and x the f32 inputs.
// `tight` (f16-rounded weights; x and h = silu(g) u, from f32 g and u, as the kernels read them:
// `x_as_seen`, f16 or hi + lo for the split formats) and `exact` (f32 weights, f64 everywhere),
// each [ts.size()][d].
static void moe_ref(int fmt_gu, int fmt_d, const uint8_t* wg, const uint8_t* wu, const uint8_t* wd, long long rb_gu,
                    long long rb_d, const std::vector<float>& x, const std::vector<uint32_t>& ids,
                    const std::vector<float>& wts, int k, int d, int nff, const std::vector<int>& ts,
                    std::vector<double>& tight, std::vector<double>& exact) {
    tight.assign(ts.size() * d, 0.0);
    exact.assign(ts.size() * d, 0.0);
    parallel_for((long long)ts.size(), [&](long long i) {
        const int t = ts[i];
        const float* xt = &x[(size_t)t * d];
        std::vector<float> row(std::max(d, nff)), he(nff);
        std::vector<double> hv(nff);
        for (int j = 0; j < k; j++) {
            const size_t e = ids[(size_t)t * k + j];
            for (int f = 0; f < nff; f++) {
                double gt = 0, ut = 0, ge = 0, ue = 0;
                deq_row(fmt_gu, wg + (e * nff + f) * rb_gu, d, row.data());
                for (int c = 0; c < d; c++) {
                    gt += (double)round_h(row[c]) * x_as_seen(fmt_gu, xt[c]);
                    ge += (double)row[c] * xt[c];
                }
                deq_row(fmt_gu, wu + (e * nff + f) * rb_gu, d, row.data());
                for (int c = 0; c < d; c++) {
                    ut += (double)round_h(row[c]) * x_as_seen(fmt_gu, xt[c]);
                    ue += (double)row[c] * xt[c];
                }
                const float g32 = (float)gt, u32 = (float)ut;
                hv[f] = x_as_seen(fmt_d, g32 / (1.0f + std::exp(-g32)) * u32);
                he[f] = (float)(ge / (1.0 + std::exp(-ge)) * ue);
            }
            for (int o = 0; o < d; o++) {
                deq_row(fmt_d, wd + (e * d + o) * rb_d, nff, row.data());
                double yt = 0, ye = 0;
                for (int f = 0; f < nff; f++) {
                    yt += (double)round_h(row[f]) * hv[f];
                    ye += (double)row[f] * he[f];
                }
                tight[i * d + o] += wts[(size_t)t * k + j] * yt;
                exact[i * d + o] += wts[(size_t)t * k + j] * ye;
            }
        }
    });
}

}  // namespace host
