// mvtc_checks.cpp: the tensor-core matvec candidates (strict tier) run on the CPU emulator
// (pf_emu.h: every CUDA thread a coroutine, mma.sync / shuffles as warp collectives per the PTX
// fragment layouts) against a double-precision dot product of the dequantized rows, at the bound
// matvec_bench.cu applies to every exact kernel: |got - want| <= 1e-5 * sum |w x| per row.
//   Q4_K: kernels-cuda/matvec_tc.cuh (f16 MMA, production; also its prep_row against prep_x); Q6_K: matvec_tc6.cuh and Q8_0: matvec_tc8.cuh (s8 MMA).
// The production body (mv_body) with a MoE layer's shared expert (its `_sh_` kernels) against the
// composition without it: gate/up rows bit for bit, down sums within the bound.
// The emulator also aborts if any HFMA2 of the Q4_K decode is inexact, if any s8 MMA sum leaves
// int32 (the designs bound them), and, under AddressSanitizer, on any read past the weights or the
// x buffers. Also checked: NaN / inf in x give non-finite outputs, and deliberately broken prep
// buffers (a swapped B word, a dropped word, a scale off by 1%) fail the bound (the checks can fail).
// Build and run: bash dev/cuda/emu/run-emu.sh mvtc
#define PF_EMU 1
#include <cstdarg>
#include <functional>
#include <string>
#include <vector>

#include "matvec_tc.cuh"
#include "matvec_tc6.cuh"
#include "matvec_tc8.cuh"
#include "../pf_ref.h"

static int g_fail = 0, g_checks = 0;

// The prefill harness's random numbers and ggml-order dequantization (pf_ref.h).
static host::Rng rng(0x6d76u);
static uint64_t rnd() { return rng.next(); }
static double urand() { return rng.uni(); }
static uint16_t f2h(float v) { return __half_raw(__float2half_rn(v)).x; }
using pf_emu::dev_alloc;
using pf_emu::dev_free;

static std::vector<uint8_t> random_q4k(int rows, int n_in) {
    std::vector<uint8_t> w((size_t)rows * (n_in / 256) * 144);
    for (auto& b : w) b = (uint8_t)rnd();
    for (size_t i = 0; i < w.size() / 144; i++) {
        uint8_t* b = w.data() + 144 * i;
        // Positive scales of sane size; every 16th super-block 256x smaller (as the prefill emu).
        const float small = (rnd() & 15) == 0 ? 1.0f / 256 : 1.0f;
        const uint16_t d = f2h((float)(1 + urand()) * 0x1p-13f * small), dm = f2h((float)(1 + urand()) * 0x1p-13f * small);
        b[0] = d & 0xff, b[1] = d >> 8, b[2] = dm & 0xff, b[3] = dm >> 8;
    }
    return w;
}

// x patterns: what the f16 split must survive.
static std::vector<float> make_x(int kind, int n) {
    std::vector<float> x(n);
    for (int i = 0; i < n; i++) {
        const double u = urand() * 2 - 1;
        switch (kind) {
            case 0: x[i] = (float)u; break;  // uniform
            case 1: {  // per sub-block magnitudes 2^-30 .. 2^30, zero sub-blocks, a tiny sub-block
                const int sub = i / 32;
                const int e = (int)((sub * 2654435761u) % 61) - 30;
                x[i] = sub % 7 == 3 ? 0.0f : sub % 11 == 5 ? (float)(u * 1e-30) : (float)ldexp(u, e);
                break;
            }
            case 2: {  // per element magnitudes 2^-40 .. 2^20 (wide range inside a super-block)
                x[i] = (float)ldexp(u, (int)(rnd() % 61) - 40);
                if (rnd() % 9 == 0) x[i] = 0.0f;
                break;
            }
            case 3: {  // extremes: huge super-blocks, subnormal ones, all-zero ones, one large outlier
                const int sbk = i / 256;
                x[i] = sbk % 4 == 0 ? (float)(u * 1e36) : sbk % 4 == 1 ? (float)(u * 1e-39) : sbk % 4 == 2 ? 0.0f
                                                                                                : (float)(u * 1e-3);
                if (sbk % 4 == 3 && i % 256 == 17) x[i] = 3e4f;
                break;
            }
        }
    }
    return x;
}


// Q6_K: random ql/qh, scales over the whole int8 range (-128 included), sane d, every 16th
// super-block 256x smaller. Q8_0: random quants (-128 included), the same d.
static std::vector<uint8_t> random_q6k(int rows, int n_in) {
    std::vector<uint8_t> w((size_t)rows * (n_in / 256) * 210);
    for (auto& b : w) b = (uint8_t)rnd();
    for (size_t i = 0; i < w.size() / 210; i++) {
        uint8_t* b = w.data() + 210 * i;
        if (i % 5 == 2) b[192] = 0x80, b[193] = 0x7f;  // sc -128 and 127 with q 0 / 63 somewhere
        const float small = (rnd() & 15) == 0 ? 1.0f / 256 : 1.0f;
        const uint16_t d = f2h((float)(1 + urand()) * 0x1p-13f * small);
        b[208] = d & 0xff, b[209] = d >> 8;
    }
    return w;
}
static std::vector<uint8_t> random_q80(int rows, int n_in) {
    std::vector<uint8_t> w((size_t)rows * (n_in / 32) * 34);
    for (auto& b : w) b = (uint8_t)rnd();
    for (size_t i = 0; i < w.size() / 34; i++) {
        uint8_t* b = w.data() + 34 * i;
        const float small = (rnd() & 15) == 0 ? 1.0f / 256 : 1.0f;
        const uint16_t d = f2h((float)(1 + urand()) * 0x1p-10f * small);
        b[0] = d & 0xff, b[1] = d >> 8;
        if (i % 7 == 3) b[2] = 0x80, b[3] = 0x7f;  // -128 and 127
    }
    return w;
}

// A change to the prep kernel's output (B words, scales) before the product: the mutation checks.
using Mutate = std::function<void(uint32_t* xb, size_t n_words, float* xf, size_t n_fact)>;

// Each runner: prep + product on the emulator, the outputs.
template <int R, int KW>
static std::vector<float> run_q4k(const std::vector<uint8_t>& hw, const std::vector<float>& hx, int n_out, int n_in,
                                  const Mutate& mut) {
    const size_t rb = (size_t)(n_in / 256) * 144, nsb = n_in / 256;
    uint8_t* w = dev_alloc<uint8_t>(hw.size());
    memcpy(w, hw.data(), hw.size());
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xa = dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS);
    float* xs = dev_alloc<float>(nsb * mvtc::SB_SUMS);
    float* out = dev_alloc<float>(n_out);
    pf_emu::launch(dim3(nsb), dim3(32), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, xa, xs}); });
    if (mut) mut(xa, nsb * mvtc::SB_WORDS, xs, nsb * mvtc::SB_SUMS);
    const mvtc::Args a{w, xa, xs, out, n_out, n_in, rb};
    pf_emu::launch(dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * KW), 0, pf_emu::EARLY,
                   [&] { mvtc::q4k_body<R, KW>(a); });
    std::vector<float> o(out, out + n_out);
    dev_free(w), dev_free(x), dev_free(xa), dev_free(xs), dev_free(out);
    return o;
}
template <int R, int KW>
static std::vector<float> run_q80(const std::vector<uint8_t>& hw, const std::vector<float>& hx, int n_out, int n_in,
                                  const Mutate& mut) {
    const size_t rb = (size_t)(n_in / 32) * 34, ng = n_in / 256;
    uint8_t* w = dev_alloc<uint8_t>(hw.size());
    memcpy(w, hw.data(), hw.size());
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xb = dev_alloc<uint32_t>(ng * mvtc8::G_WORDS);
    float* xf = dev_alloc<float>(ng * mvtc8::G_FACT);
    float* out = dev_alloc<float>(n_out);
    pf_emu::launch(dim3(ng), dim3(256), 0, pf_emu::EARLY, [&] { mvtc8::prep_x_body(mvtc8::PrepArgs{x, xb, xf}); });
    if (mut) mut(xb, ng * mvtc8::G_WORDS, xf, ng * mvtc8::G_FACT);
    const mvtc8::Args a{w, xb, xf, out, n_out, n_in, rb};
    pf_emu::launch(dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * KW), 0, pf_emu::EARLY,
                   [&] { mvtc8::q80_body<R, KW>(a); });
    std::vector<float> o(out, out + n_out);
    dev_free(w), dev_free(x), dev_free(xb), dev_free(xf), dev_free(out);
    return o;
}
template <int R>
static std::vector<float> run_q6k(const std::vector<uint8_t>& hw, const std::vector<float>& hx, int n_out, int n_in,
                                  const Mutate& mut) {
    const size_t rb = (size_t)(n_in / 256) * 210, nsb = n_in / 256;
    uint8_t* w = dev_alloc<uint8_t>(hw.size());
    memcpy(w, hw.data(), hw.size());
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xb = dev_alloc<uint32_t>(nsb * mvtc6::SB_WORDS);
    float* xs = dev_alloc<float>(nsb);
    float* out = dev_alloc<float>(n_out);
    pf_emu::launch(dim3(nsb), dim3(256), 0, pf_emu::EARLY, [&] { mvtc6::prep_x_body(mvtc6::PrepArgs{x, xb, xs}); });
    if (mut) mut(xb, nsb * mvtc6::SB_WORDS, xs, nsb);
    const mvtc6::Args a{w, xb, xs, out, n_out, n_in, rb};
    pf_emu::launch(dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * mvtc6::KW), 0, pf_emu::EARLY,
                   [&] { mvtc6::q6k_body<R>(a); });
    std::vector<float> o(out, out + n_out);
    dev_free(w), dev_free(x), dev_free(xb), dev_free(xs), dev_free(out);
    return o;
}

using Runner = std::vector<float> (*)(const std::vector<uint8_t>&, const std::vector<float>&, int, int, const Mutate&);
enum Expect { PASS_BOUND, FAIL_BOUND, NONFINITE };

// One check: random weights of `fmt`, x of `xkind` (or the given x), the runner's outputs against
// the f64 reference; `expect` says whether the bound must hold, must be broken (a mutation) or
// every output must be non-finite (NaN / inf in x).
static void check(const char* name, int fmt, Runner run, const char* what, int n_out, int n_in,
                  const std::vector<float>& hx, Expect expect, const Mutate& mut = nullptr) {
    const std::vector<uint8_t> hw = fmt == host::Q4K ? random_q4k(n_out, n_in)
                                    : fmt == host::Q6K ? random_q6k(n_out, n_in)
                                                       : random_q80(n_out, n_in);
    const std::vector<float> out = run(hw, hx, n_out, n_in, mut);
    const size_t rb = hw.size() / n_out;
    double worst = 0;
    int wr = 0, finite = 0;
    std::vector<float> y(n_in);
    for (int r = 0; r < n_out; r++) {
        host::deq_row(fmt, hw.data() + r * rb, n_in, y.data());
        double s = 0, mag = 0;
        for (int i = 0; i < n_in; i++) {
            s += (double)y[i] * hx[i];
            mag += fabs((double)y[i] * hx[i]);
        }
        finite += std::isfinite(out[r]) ? 1 : 0;
        const double e = fabs((double)out[r] - s) / (mag > 0 ? mag : 1e-300);
        if (!(e <= worst)) {
            worst = std::isnan(e) ? INFINITY : e;
            wr = r;
        }
    }
    g_checks++;
    bool ok;
    char res[96];
    if (expect == NONFINITE) {
        ok = finite == 0;
        snprintf(res, sizeof res, "%d of %d outputs finite (want 0)", finite, n_out);
    } else {
        ok = expect == PASS_BOUND ? worst <= 1e-5 : worst > 1e-5;
        snprintf(res, sizeof res, "worst |err| / sum|w x| = %.2e (row %d)%s", worst, wr,
                 expect == FAIL_BOUND ? " (must exceed 1e-5)" : "");
    }
    if (!ok) g_fail++;
    printf("%s %-14s %-34s %5dx%-5d %s\n", ok ? "ok  " : "FAIL", name, what, n_out, n_in, res);
    fflush(stdout);
}

static const char* KINDS[] = {"x uniform", "x per-sub-block 2^+-30/0/tiny", "x per-element 2^-40..2^20",
                              "x 1e36/subnormal/zero/outlier"};

// NaN (kind 4) or +inf (kind 5) at one element of otherwise uniform x.
static std::vector<float> x_with(int kind, int n) {
    std::vector<float> x = make_x(0, n);
    x[n / 3 + 5] = kind == 4 ? NAN : INFINITY;
    return x;
}

// prep_row (the RMSNorms' in-kernel prep: one block of `threads` per row, 256 per super-block)
// writes the same words and sums as prep_x_body (one block of one warp per super-block), bit for bit.
static void check_prep_row(int threads, int n_in, int xkind) {
    const std::vector<float> hx = make_x(xkind, n_in);
    const size_t nsb = n_in / 256;
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xa[2] = {dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS), dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS)};
    float* xs[2] = {dev_alloc<float>(nsb * mvtc::SB_SUMS), dev_alloc<float>(nsb * mvtc::SB_SUMS)};
    pf_emu::launch(dim3(nsb), dim3(32), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, xa[0], xs[0]}); });
    pf_emu::launch(dim3(1), dim3(threads), 0, pf_emu::EARLY, [&] { mvtc::prep_row(x, n_in, xa[1], xs[1]); });
    int bad = 0;
    for (size_t i = 0; i < nsb * mvtc::SB_WORDS; i++) bad += xa[0][i] != xa[1][i];
    for (size_t b = 0; b < nsb; b++)
        for (int j = 0; j < 9; j++) bad += memcmp(&xs[0][b * mvtc::SB_SUMS + j], &xs[1][b * mvtc::SB_SUMS + j], 4) != 0;
    g_checks++;
    if (bad) g_fail++;
    printf("%s mvtc prep_row %4d threads, n %5d, x kind %d: %d words or sums differ from prep_x\n", bad ? "FAIL" : "ok  ",
           threads, n_in, xkind, bad);
    for (int k = 0; k < 2; k++) {
        dev_free(xa[k]);
        dev_free(xs[k]);
    }
    dev_free(x);
}

// ---------------------------------------------------------------------------------------------
// The production body (matvec_tc.cuh mv_body) with a MoE layer's shared expert as expert k of
// each token's k + 1 (the `_sh_` kernels, common.cuh MvShared), against the composition the
// backend runs without them: the routed experts (the MoE kernels: gate/up rows, a k-way down sum),
// the shared expert's SwiGLU and down products (the dense kernels) and out += sigmoid(gate logit)
// * shared. The gate/up rows are the same arithmetic: bit for bit. The down sums take the shared
// term inside the sum (other rounding): within the bound of the composition and of the f64
// reference (|err| <= 1e-5 sum |w h| per output).

// `rows` rows of n_in f32 values at x prepared in format F's layout.
struct XPrep {
    uint32_t* xa;
    float* xs;
};
template <class F>
static XPrep prep_rows(int fmt, const float* x, int rows, int n_in) {
    const int nsb = n_in / 256;
    XPrep p{dev_alloc<uint32_t>((size_t)rows * nsb * F::WORDS), dev_alloc<float>((size_t)rows * nsb * F::SUMS)};
    if (fmt == host::Q4K)
        pf_emu::launch(dim3(nsb, rows), dim3(32), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, p.xa, p.xs}); });
    else if (fmt == host::Q80)
        pf_emu::launch(dim3(nsb, rows), dim3(256), 0, pf_emu::EARLY,
                       [&] { mvtc8::prep_x_body(mvtc8::PrepArgs{x, p.xa, p.xs}); });
    else
        pf_emu::launch(dim3(nsb, rows), dim3(256), 0, pf_emu::EARLY,
                       [&] { mvtc6::prep_x_body(mvtc6::PrepArgs{x, p.xa, p.xs}); });
    return p;
}

// One launch of the production kernels' body (R = 1, KW = 8: mvtc_, mvtc_glu_ and their `_sh_`
// forms), the slots as src/backend/cuda/ops/matvec_tc.rs fills them.
struct MoeLaunch {
    const uint8_t *w, *w2 = nullptr;
    XPrep x;
    float* out;
    const uint32_t* ids = nullptr;
    const float* scales = nullptr;
    int n_out, n_in;
    size_t rb, expert_bytes = 0;
    int n_experts = 1, x_group = 1, nsum = 1, vectors;
    const uint8_t* sh = nullptr;  // p7
    const void* sh2 = nullptr;    // n8
};
template <class F, bool GLU, bool SHARED>
static void launch_moe(const MoeLaunch& m) {
    ::Args a;
    memset(&a, 0, sizeof a);
    a.p[0] = (unsigned long long)m.w, a.p[1] = (unsigned long long)m.w2, a.p[2] = (unsigned long long)m.x.xa;
    a.p[3] = (unsigned long long)m.out, a.p[4] = (unsigned long long)m.ids, a.p[5] = (unsigned long long)m.scales;
    a.p[6] = (unsigned long long)m.x.xs, a.p[7] = (unsigned long long)m.sh;
    a.n[0] = m.n_out, a.n[1] = m.n_in, a.n[2] = (long long)m.rb, a.n[3] = (long long)m.expert_bytes;
    a.n[4] = m.n_experts, a.n[5] = m.x_group, a.n[6] = m.nsum, a.n[7] = m.n_out;
    a.n[8] = (long long)(uintptr_t)m.sh2;
    pf_emu::launch(dim3((m.n_out + 15) / 16, m.vectors), dim3(256), 0, pf_emu::EARLY,
                   [&] { mvtc::mv_body<F, 1, 8, GLU, false, SHARED>(a); });
}

// `mutate`: the fused down product reads the routing weights as the gate logits (must fail the bound).
template <class F>
static void check_shared(const char* name, int fmt, int E, int k, int T, int d, int f, bool mutate = false) {
    auto random_w = [&](int rows, int n_in) {
        return fmt == host::Q4K ? random_q4k(rows, n_in) : fmt == host::Q6K ? random_q6k(rows, n_in) : random_q80(rows, n_in);
    };
    auto up = [](const auto& v) {
        using T_ = typename std::decay_t<decltype(v)>::value_type;
        T_* p = dev_alloc<T_>(v.size());
        memcpy(p, v.data(), v.size() * sizeof(T_));
        return p;
    };
    const auto hg = random_w(E * f, d), hu = random_w(E * f, d), hd = random_w(E * d, f);
    const auto hgs = random_w(f, d), hus = random_w(f, d), hds = random_w(d, f);
    const size_t rbg = hg.size() / (E * f), rbd = hd.size() / (E * d);
    const std::vector<float> hx = make_x(0, T * d);
    std::vector<uint32_t> hids(T * k);
    std::vector<float> hws(T * k), hsg(T);
    for (int i = 0; i < T * k; i++) hids[i] = (uint32_t)(rnd() % E), hws[i] = (float)urand();
    hids[T * k - 1] = E + 3;  // an invalid id: contributes nothing
    for (int t = 0; t < T; t++) hsg[t] = t % 3 == 0 ? 0.7f : t % 3 == 1 ? -30.0f : 12.0f;
    uint8_t *g = up(hg), *u = up(hu), *dn = up(hd), *gs = up(hgs), *us = up(hus), *ds = up(hds);
    float *x = up(hx), *ws = up(hws), *sg = up(hsg);
    uint32_t* ids = up(hids);
    float *hr = dev_alloc<float>((size_t)T * k * f), *hs = dev_alloc<float>((size_t)T * f);
    float* hf = dev_alloc<float>((size_t)T * (k + 1) * f);
    float *orr = dev_alloc<float>((size_t)T * d), *os = dev_alloc<float>((size_t)T * d), *of = dev_alloc<float>((size_t)T * d);
    const XPrep xp = prep_rows<F>(fmt, x, T, d);
    // The composition.
    launch_moe<F, true, false>({g, u, xp, hr, ids, nullptr, f, d, rbg, f * rbg, E, k, 1, T * k});
    launch_moe<F, true, false>({gs, us, xp, hs, nullptr, nullptr, f, d, rbg, 0, 1, 1, 1, T});
    const XPrep hrp = prep_rows<F>(fmt, hr, T * k, f), hsp = prep_rows<F>(fmt, hs, T, f);
    launch_moe<F, false, false>({dn, nullptr, hrp, orr, ids, ws, d, f, rbd, d * rbd, E, 1, k, T});
    launch_moe<F, false, false>({ds, nullptr, hsp, os, nullptr, nullptr, d, f, rbd, 0, 1, 1, 1, T});
    // Fused: k + 1 entries per token.
    launch_moe<F, true, true>({g, u, xp, hf, ids, nullptr, f, d, rbg, f * rbg, E, k + 1, 1, T * (k + 1), gs, us});
    int differ = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j <= k; j++)
            for (int o = 0; o < f; o++) {
                const float* want = j < k ? &hr[((size_t)t * k + j) * f + o] : &hs[(size_t)t * f + o];
                differ += memcmp(&hf[((size_t)t * (k + 1) + j) * f + o], want, 4) != 0;
            }
    const XPrep hfp = prep_rows<F>(fmt, hf, T * (k + 1), f);
    launch_moe<F, false, true>({dn, nullptr, hfp, of, ids, ws, d, f, rbd, d * rbd, E, 1, k + 1, T, ds, mutate ? ws : sg});
    // The composition's sum (sigmoid_scale_add) and the f64 reference on the hidden rows.
    std::vector<float> y(f);
    double worst_comp = 0, worst_ref = 0;
    for (int t = 0; t < T; t++) {
        const double sig = 1.0 / (1.0 + exp(-(double)hsg[t]));
        for (int o = 0; o < d; o++) {
            const size_t i = (size_t)t * d + o;
            double ref = 0, mag = 0;
            for (int j = 0; j <= k; j++) {
                const uint32_t e = j < k ? hids[t * k + j] : 0;
                if (j < k && e >= (uint32_t)E) continue;
                const double wj = j < k ? hws[t * k + j] : sig;
                const uint8_t* row = j < k ? hd.data() + ((size_t)e * d + o) * rbd : hds.data() + (size_t)o * rbd;
                host::deq_row(fmt, row, f, y.data());
                double sum = 0, m = 0;
                for (int q = 0; q < f; q++) {
                    const double p = (double)y[q] * hf[((size_t)t * (k + 1) + j) * f + q];
                    sum += p;
                    m += fabs(p);
                }
                ref += wj * sum;
                mag += fabs(wj) * m;
            }
            const float comp = orr[i] + (1.0f / (1.0f + expf(-hsg[t]))) * os[i];
            mag = mag > 0 ? mag : 1e-300;
            const double ec = fabs((double)of[i] - comp) / mag, er = fabs((double)of[i] - ref) / mag;
            worst_comp = std::isnan(ec) ? INFINITY : std::max(worst_comp, ec);
            worst_ref = std::isnan(er) ? INFINITY : std::max(worst_ref, er);
        }
    }
    const bool pass = differ == 0 && worst_comp <= 1e-5 && worst_ref <= 1e-5;
    const bool ok = mutate ? differ == 0 && !pass : pass;
    g_checks++;
    if (!ok) g_fail++;
    printf("%s mvtc shared %-5s%s E=%d k=%d T=%d d=%d f=%d: %d hidden values differ from the composition's; down "
           "worst |err| / sum|w h| %.2e vs composition, %.2e vs f64%s\n",
           ok ? "ok  " : "FAIL", name, mutate ? " MUTATION wrong gate logits" : "", E, k, T, d, f, differ,
           worst_comp, worst_ref, mutate ? " (must exceed 1e-5)" : "");
    fflush(stdout);
    for (void* p : {(void*)g, (void*)u, (void*)dn, (void*)gs, (void*)us, (void*)ds, (void*)x, (void*)ws, (void*)sg,
                    (void*)ids, (void*)hr, (void*)hs, (void*)hf, (void*)orr, (void*)os, (void*)of})
        dev_free(p);
    for (const XPrep& p : {xp, hrp, hsp, hfp}) dev_free(p.xa), dev_free(p.xs);
}

int main() {
    // Q4_K (matvec_tc.cuh).
    for (int k = 0; k < 4; k++) {
        // 40 rows: the last tile half past the end; 6 super-blocks over 8 warps: two warps idle.
        check("q4k R=2 KW=4", host::Q4K, run_q4k<2, 4>, KINDS[k], 40, 2048, make_x(k, 2048), PASS_BOUND);
        check("q4k R=1 KW=8", host::Q4K, run_q4k<1, 8>, KINDS[k], 24, 1536, make_x(k, 1536), PASS_BOUND);
    }
    check("q4k R=4 KW=4", host::Q4K, run_q4k<4, 4>, KINDS[0], 64, 4096, make_x(0, 4096), PASS_BOUND);
    check("q4k R=4 KW=2", host::Q4K, run_q4k<4, 2>, KINDS[2], 33, 2560, make_x(2, 2560), PASS_BOUND);

    check_prep_row(1024, 4096, 0);  // 4 groups, 4 rounds
    check_prep_row(1024, 2560, 2);  // 10 super-blocks: groups idle in the last round
    check_prep_row(512, 2048, 3);
    check_prep_row(256, 768, 1);

    // Q8_0 (matvec_tc8.cuh): odd row counts, 1..5 groups per warp, a tall row.
    for (int k = 0; k < 4; k++) {
        check("q80 R=2 KW=4", host::Q80, run_q80<2, 4>, KINDS[k], 40, 2048, make_x(k, 2048), PASS_BOUND);
        check("q80 R=1 KW=8", host::Q80, run_q80<1, 8>, KINDS[k], 17, 2560, make_x(k, 2560), PASS_BOUND);
    }
    check("q80 R=1 KW=8", host::Q80, run_q80<1, 8>, "x uniform, one group", 1, 256, make_x(0, 256), PASS_BOUND);
    check("q80 R=2 KW=4", host::Q80, run_q80<2, 4>, "x per-element, tall rows", 9, 12288, make_x(2, 12288), PASS_BOUND);
    check("q80 R=2 KW=8", host::Q80, run_q80<2, 8>, KINDS[1], 33, 4096, make_x(1, 4096), PASS_BOUND);
    check("q80 R=2 KW=4", host::Q80, run_q80<2, 4>, "x with a NaN", 24, 1024, x_with(4, 1024), NONFINITE);
    check("q80 R=1 KW=8", host::Q80, run_q80<1, 8>, "x with an inf", 24, 1024, x_with(5, 1024), NONFINITE);

    // Q6_K (matvec_tc6.cuh): every warp offset (8 super-blocks per row at least), odd row counts.
    for (int k = 0; k < 4; k++) {
        check("q6k R=1", host::Q6K, run_q6k<1>, KINDS[k], 40, 2048, make_x(k, 2048), PASS_BOUND);
        check("q6k R=2", host::Q6K, run_q6k<2>, KINDS[k], 33, 4096, make_x(k, 4096), PASS_BOUND);
    }
    check("q6k R=1", host::Q6K, run_q6k<1>, "x per-element, tall rows", 9, 12288, make_x(2, 12288), PASS_BOUND);
    check("q6k R=2", host::Q6K, run_q6k<2>, "x uniform, one row", 1, 2048, make_x(0, 2048), PASS_BOUND);
    check("q6k R=1", host::Q6K, run_q6k<1>, "x with a NaN", 16, 2048, x_with(4, 2048), NONFINITE);
    check("q6k R=2", host::Q6K, run_q6k<2>, "x with an inf", 16, 2048, x_with(5, 2048), NONFINITE);

    // Mutations: the same checks must fail when the prep output is broken.
    const std::vector<float> xu = make_x(0, 2048);
    // (They must touch the top digits: digit 0 carries 2^-24 of a block's sum, below the bound.)
    auto swap01 = [](uint32_t* xb, size_t, float*, size_t) { std::swap(xb[0], xb[1]); };  // q4k: hi term
    auto q80_swap = [](uint32_t* xb, size_t, float*, size_t) {  // lane (n 3, t 0): digit 3, pair 0
        std::swap(xb[12 * 24 + 0], xb[12 * 24 + 1]);
    };
    auto q80_drop = [](uint32_t* xb, size_t n, float*, size_t) {  // the third MMA's digit 3 (lane n 7, t 0)
        for (size_t i = 0; i < n; i += mvtc8::G_WORDS)
            for (int P = 0; P < 4; P++) xb[i + 28 * 24 + 6 * P + 4] = 0;
    };
    auto q80_scale = [](uint32_t*, size_t, float* xf, size_t) { xf[5] *= 1.01f; };  // block 2, digits 2, 3
    auto q6_swap = [](uint32_t* xb, size_t, float*, size_t) { std::swap(xb[4], xb[5]); };  // digits 2, 3: b0 <-> b1
    auto q6_scale = [](uint32_t*, size_t, float* xf, size_t) { xf[1] *= 1.01f; };
    check("q80 R=2 KW=4", host::Q80, run_q80<2, 4>, "MUTATION swapped B words", 24, 2048, xu, FAIL_BOUND, q80_swap);
    check("q80 R=2 KW=4", host::Q80, run_q80<2, 4>, "MUTATION third MMA dropped", 24, 2048, xu, FAIL_BOUND, q80_drop);
    check("q80 R=1 KW=8", host::Q80, run_q80<1, 8>, "MUTATION block scale +1%", 24, 2048, xu, FAIL_BOUND, q80_scale);
    check("q6k R=1", host::Q6K, run_q6k<1>, "MUTATION B digits swapped", 24, 2048, xu, FAIL_BOUND, q6_swap);
    check("q6k R=1", host::Q6K, run_q6k<1>, "MUTATION sb scale +1%", 24, 2048, xu, FAIL_BOUND, q6_scale);
    check("q4k R=2 KW=4", host::Q4K, run_q4k<2, 4>, "MUTATION swapped A words", 24, 2048, xu, FAIL_BOUND, swap01);

    // The shared expert in the production kernels: several tokens, the 35B-A3B's k = 8.
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 6, 3, 3, 512, 256);
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 12, 8, 1, 256, 256);
    check_shared<mvtc8::TcQ80>("q80", host::Q80, 6, 3, 2, 256, 512);
    check_shared<mvtc6::TcQ6K>("q6k", host::Q6K, 3, 2, 1, 2048, 2048);
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 6, 3, 2, 256, 256, true);

    printf("%s: %d of %d mvtc checks failed\n", g_fail ? "FAIL" : "PASS", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
