// mvtc_checks.cpp: the tensor-core matvec candidates (strict tier) run on the CPU emulator
// (pf_emu.h: every CUDA thread a coroutine, mma.sync / shuffles as warp collectives per the PTX
// fragment layouts) against a double-precision dot product of the dequantized rows, at the bound
// matvec_bench.cu applies to every exact kernel: |got - want| <= 1e-5 * sum |w x| per row.
//   Q4_K: kernels-cuda/matvec_tc.cuh (f16 MMA, production; also its prep_row against prep_x); Q6_K: matvec_tc6.cuh and Q8_0: matvec_tc8.cuh (s8 MMA).
// The production body (mv_body) with grouped launches (several products in one grid, the segment
// table of common.cuh): bit for bit what each product gives launched alone.
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

// The largest |out[r] - W[r] . x| / sum |W[r] x| over the n_out rows of weights hw in format fmt
// (f64 dot products of the dequantized rows), its row, and how many outputs are finite.
static double worst_err(int fmt, const std::vector<uint8_t>& hw, const float* hx, const float* out, int n_out, int n_in,
                        int& wr, int& finite) {
    const size_t rb = hw.size() / n_out;
    double worst = 0;
    wr = 0, finite = 0;
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
    return worst;
}

// One check: random weights of `fmt`, x of `xkind` (or the given x), the runner's outputs against
// the f64 reference; `expect` says whether the bound must hold, must be broken (a mutation) or
// every output must be non-finite (NaN / inf in x).
static void check(const char* name, int fmt, Runner run, const char* what, int n_out, int n_in,
                  const std::vector<float>& hx, Expect expect, const Mutate& mut = nullptr) {
    const std::vector<uint8_t> hw = fmt == host::Q4K ? random_q4k(n_out, n_in)
                                    : fmt == host::Q6K ? random_q6k(n_out, n_in)
                                                       : random_q80(n_out, n_in);
    const std::vector<float> out = run(hw, hx, n_out, n_in, mut);
    int wr = 0, finite = 0;
    const double worst = worst_err(fmt, hw, hx.data(), out.data(), n_out, n_in, wr, finite);
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
// The production body (matvec_tc.cuh mv_body) and its segment table (common.cuh): a group of
// products of one x in one launch (Backend::matmul_group) must give, bit for bit, what each
// product gives launched alone with the same kernel, for row counts that are not a multiple of a
// block's rows (a block never mixes products: each product's blocks are rounded up and its last
// block masks the rows past its end) and several output vectors (grid.y). Each output has a
// buffer of its exact size: AddressSanitizer catches a write past it, a wrong segment shows as a
// difference.

// x (T rows of n_in) prepared in format fmt's layout: the A/B words and the sums of every row.
struct TcPrep {
    uint32_t* xa;
    float* xs;
};
static TcPrep prep_tc(int fmt, const float* x, int T, int n_in) {
    const int nsb = n_in / 256;
    TcPrep p;
    if (fmt == host::Q4K) {
        p = {dev_alloc<uint32_t>((size_t)T * nsb * mvtc::SB_WORDS), dev_alloc<float>((size_t)T * nsb * mvtc::SB_SUMS)};
        pf_emu::launch(dim3(nsb, T), dim3(32), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, p.xa, p.xs}); });
    } else if (fmt == host::Q80) {
        p = {dev_alloc<uint32_t>((size_t)T * nsb * mvtc8::G_WORDS), dev_alloc<float>((size_t)T * nsb * mvtc8::G_FACT)};
        pf_emu::launch(dim3(nsb, T), dim3(256), 0, pf_emu::EARLY,
                       [&] { mvtc8::prep_x_body(mvtc8::PrepArgs{x, p.xa, p.xs}); });
    } else {
        p = {dev_alloc<uint32_t>((size_t)T * nsb * mvtc6::SB_WORDS), dev_alloc<float>((size_t)T * nsb)};
        pf_emu::launch(dim3(nsb, T), dim3(256), 0, pf_emu::EARLY,
                       [&] { mvtc6::prep_x_body(mvtc6::PrepArgs{x, p.xa, p.xs}); });
    }
    return p;
}

// One launch of mv_body<F, R, KW> over the products `idx` of (weights, outputs, rows), as
// src/backend/cuda/ops/linear.rs fills it (Mv::chunks, matvec_tc::run) for a dense product.
// `swap` exchanges the first two segments' weights (the mutation check; equal row counts).
template <class F, int R, int KW, bool DENSE>
static void launch_body(const std::vector<int>& idx, const std::vector<uint8_t*>& w, const std::vector<float*>& out,
                        const std::vector<int>& rows, const TcPrep& x, int T, int n_in, size_t rb, bool swap = false) {
    ::Args a;
    memset(&a, 0, sizeof a);
    int blocks = 0;
    for (size_t s = 0; s < idx.size(); s++) {
        const int i = idx[s];
        a.seg[s] = MvSeg{(unsigned long long)w[i], (unsigned long long)out[i], rows[i], blocks};
        blocks += (rows[i] + 16 * R - 1) / (16 * R);
    }
    if (swap) std::swap(a.seg[0].w, a.seg[1].w);
    a.p[2] = (unsigned long long)x.xa;
    a.p[6] = (unsigned long long)x.xs;
    a.n[1] = n_in;
    a.n[2] = (long long)rb;
    a.n[4] = 1;  // n_experts
    a.n[5] = 1;  // x_group
    a.n[6] = 1;  // nsum
    pf_emu::launch(dim3(blocks, T), dim3(32 * KW), 0, pf_emu::EARLY, [&] { mvtc::mv_body<F, R, KW, false, DENSE>(a); });
}

// `swap`: a broken segment table (two products' weights exchanged), which must be caught.
template <class F, int R, int KW, bool DENSE>
static void check_group(const char* name, int fmt, std::vector<int> rows, int n_in, int T, bool swap = false) {
    const int n = (int)rows.size();
    const std::vector<float> hx = make_x(0, T * n_in);
    float* x = dev_alloc<float>((size_t)T * n_in);
    memcpy(x, hx.data(), 4 * hx.size());
    const TcPrep xp = prep_tc(fmt, x, T, n_in);
    std::vector<std::vector<uint8_t>> hw(n);
    std::vector<uint8_t*> w(n);
    std::vector<float*> alone(n), grouped(n);
    size_t rb = 0;
    for (int i = 0; i < n; i++) {
        hw[i] = fmt == host::Q4K ? random_q4k(rows[i], n_in) : fmt == host::Q6K ? random_q6k(rows[i], n_in)
                                                                                : random_q80(rows[i], n_in);
        rb = hw[i].size() / rows[i];
        w[i] = dev_alloc<uint8_t>(hw[i].size());
        memcpy(w[i], hw[i].data(), hw[i].size());
        alone[i] = dev_alloc<float>((size_t)T * rows[i]);
        grouped[i] = dev_alloc<float>((size_t)T * rows[i]);
    }
    std::vector<int> all;
    for (int i = 0; i < n; i++) {
        launch_body<F, R, KW, DENSE>({i}, w, alone, rows, xp, T, n_in, rb);
        all.push_back(i);
    }
    launch_body<F, R, KW, DENSE>(all, w, grouped, rows, xp, T, n_in, rb, swap);
    // Each product alone against the f64 reference (the production body's own check), then the
    // group against the products alone.
    int bad = 0, wrong = 0;
    double worst = 0;
    std::string desc;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < T; t++) {
            int wr, finite;
            const double e = worst_err(fmt, hw[i], hx.data() + (size_t)t * n_in, alone[i] + (size_t)t * rows[i], rows[i],
                                       n_in, wr, finite);
            worst = std::max(worst, e);
            wrong += !(e <= 1e-5);
        }
        bad += memcmp(alone[i], grouped[i], 4 * (size_t)T * rows[i]) != 0;
        desc += (i ? "+" : "") + std::to_string(rows[i]);
    }
    const bool ok = wrong == 0 && (swap ? bad > 0 : bad == 0);
    g_checks++;
    if (!ok) g_fail++;
    printf("%s mvtc group %-9s%s rows %-16s n_in %5d T %d: %d of %d differ from their own launch%s; alone: worst "
           "%.2e\n",
           ok ? "ok  " : "FAIL", name, swap ? " MUTATION weights swapped" : "", desc.c_str(), n_in, T, bad, n,
           swap ? " (must be > 0)" : "", worst);
    fflush(stdout);
    for (int i = 0; i < n; i++) dev_free(w[i]), dev_free(alone[i]), dev_free(grouped[i]);
    dev_free(x), dev_free(xp.xa), dev_free(xp.xs);
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

    // Grouped launches of the production kernels (matvec_tc.cu, matvec_tc8.cu):
    // the GDN projections' shape (qkv 4096 + 8 rows here, small z / alpha / beta), a block's worth
    // of rows (32) and one more (33), one row, 1..4 products.
    check_group<mvtc::TcQ4K, 2, 4, false>("q4k tall", host::Q4K, {4104, 32, 33}, 256, 1);
    check_group<mvtc::TcQ4K, 2, 4, false>("q4k tall", host::Q4K, {33, 1, 64, 17}, 512, 3);
    check_group<mvtc::TcQ4K, 1, 8, false>("q4k", host::Q4K, {32, 33, 1, 70}, 1024, 3);
    check_group<mvtc::TcQ4K, 1, 8, false>("q4k", host::Q4K, {16}, 512, 1);
    check_group<mvtc8::TcQ80, 2, 8, true>("q80 tall", host::Q80, {4104, 33, 32, 1}, 256, 1);
    check_group<mvtc8::TcQ80, 1, 8, false>("q80", host::Q80, {17, 32, 33}, 512, 3);
    // Q6_K's kernel takes one product per launch (TcQ6K::SEGS): the production body alone.
    check_group<mvtc6::TcQ6K, 1, 8, false>("q6k", host::Q6K, {33}, 2048, 3);
    check_group<mvtc6::TcQ6K, 1, 8, false>("q6k", host::Q6K, {7}, 4096, 1);
    check_group<mvtc::TcQ4K, 1, 8, false>("q4k", host::Q4K, {32, 32}, 512, 1, true);

    printf("%s: %d of %d mvtc checks failed\n", g_fail ? "FAIL" : "PASS", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
