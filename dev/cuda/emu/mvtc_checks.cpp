// mvtc_checks.cpp: the tensor-core matvec candidates (strict tier) run on the CPU emulator
// (pf_emu.h: every CUDA thread a coroutine, mma.sync / shuffles as warp collectives per the PTX
// fragment layouts) against a double-precision dot product of the dequantized rows, at the bound
// matvec_bench.cu applies to every exact kernel: |got - want| <= 1e-5 * sum |w x| per row.
//   Q4_K: kernels-cuda/matvec_tc.cuh (f16 MMA, production); Q6_K: matvec_tc6.cuh and Q8_0: matvec_tc8.cuh (s8 MMA).
// The prepared x: the warp preps of Q8_0 and Q6_K write, bit for bit, what the former 256-thread
// prep kernels wrote (kept below as the reference), and the kernels that prepare their own output
// rows (kernels-cuda/norm.cu: rms_norm, add_rms_norm, gated_rms_norm_rows, sigmoid_mul_rows) write
// exactly what each format's prep kernel writes from that output, and nothing for rows that are
// not a multiple of 256.
// The production body (mv_body) with grouped launches (several products in one grid, the segment
// table of common.cuh): bit for bit what each product gives launched alone.
// The production body with a MoE layer's shared expert (its `_sh_` kernels) against the
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

// prod_shim.h first: matvec_tc.cuh includes common.cuh (the production body, mv_body, reads its
// Args and segment table), which needs the shim's intrinsics.
#include <cuda_fp16.h>  // before pf_emu.h (prod_shim.h), as pf_common.cuh has it
#include "prod_shim.h"
#include "matvec_tc.cuh"
#include "matvec_tc6.cuh"
#include "matvec_tc8.cuh"
#include "../pf_ref.h"
#include "norm.cu"

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
    pf_emu::launch(dim3(ng), dim3(32), 0, pf_emu::EARLY, [&] { mvtc8::prep_x_body(mvtc8::PrepArgs{x, xb, xf}); });
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
    pf_emu::launch(dim3(nsb), dim3(32), 0, pf_emu::EARLY, [&] { mvtc6::prep_x_body(mvtc6::PrepArgs{x, xb, xs}); });
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

// The former prep kernels of Q8_0 and Q6_K (one block of 256 threads per 256 inputs, one thread
// per element), verbatim: the reference the warp preps must equal bit for bit.
namespace ref_prep {
static void q80(const mvtc8::PrepArgs& p) {
    using namespace mvtc8;
    __shared__ uint32_t dig[256];
    __shared__ float inv[8];
    const int i = threadIdx.x, lane = i & 31, blk = i >> 5;
    const size_t grp = (size_t)blockIdx.y * gridDim.x + blockIdx.x;  // group index over all rows
    const float x = p.x[(size_t)grp * 256 + i];
    float m = fabsf(x);
    m = m != m ? INFINITY : m;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s;
    const float inv_s = digit_scale(m, s);
    dig[i] = digits(x, s, inv_s == inv_s);
    if (lane == 0) inv[blk] = inv_s;
    __syncthreads();
    if (i < 16) {
        const int t = i / 4, P = i % 4;
        p.xf[(size_t)grp * G_FACT + i] = inv[2 * P + (t >> 1)] * ((t & 1) ? 65536.0f : 1.0f);
    }
    for (int w = i; w < G_WORDS; w += 256) {
        const int L = w / 24, j = w % 24, P = j / 6, k = j % 6;  // k: slot (4: the third MMA's)
        const int n = L / 4, t = L % 4;
        const int col_blk = 2 * P + (n >> 2), dg = n & 3;
        uint32_t v = 0;
        if (k < 4 || (k == 4 && t == 0)) {
            const int gw = reg_word(t, slot_reg(t, P, k));
            for (int b = 0; b < 4; b++) {
                const int o = 4 * gw + b, blk_o = o / 34, pos = o % 34;
                if (pos >= 2 && blk_o == col_blk) v |= ((dig[32 * blk_o + pos - 2] >> (8 * dg)) & 0xffu) << (8 * b);
            }
        }
        p.xb[(size_t)grp * G_WORDS + w] = v;
    }
}
static void q6k(const mvtc6::PrepArgs& p) {
    __shared__ float wmax[8];
    __shared__ uint32_t dig[256];
    const int i = threadIdx.x;
    const size_t sb = (size_t)blockIdx.y * gridDim.x + blockIdx.x;  // super-block index over all rows
    const float x = p.x[(size_t)sb * 256 + i];
    float m = fabsf(x);
    m = m != m ? INFINITY : m;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((i & 31) == 0) wmax[i >> 5] = m;
    __syncthreads();
    float amax = wmax[0];
    for (int w = 1; w < 8; w++) amax = fmaxf(amax, wmax[w]);
    float s;
    const float inv_s = mvtc8::digit_scale(amax, s);
    dig[i] = mvtc8::digits(x, s, inv_s == inv_s);
    if (i == 0) p.xs[sb] = inv_s * 0.25f;
    __syncthreads();
    const int g = i >> 5, j = i & 31, t = g >> 1, dl = g & 1;
    const int h = j >> 4, nu = (j >> 3) & 1, pi = (j >> 2) & 1, wi = j & 3;  // wi = 2m + kk
    const int pt = (t >> 1) + 2 * nu, dg = 2 * pi + dl;
    uint32_t v = 0;
    for (int b = 0; b < 4; b++) {
        const int l = 16 * (t & 1) + 4 * wi + b;
        v |= ((dig[128 * h + 32 * pt + l] >> (8 * dg)) & 0xffu) << (8 * b);
    }
    p.xb[(size_t)sb * mvtc6::SB_WORDS + i] = v;
}
}  // namespace ref_prep

// The three layouts: words and sums (or scales) per 256 inputs, the norm kernels' slot.
struct Layout {
    const char* name;
    int words, sums, slot;
};
static const Layout LAYOUTS[3] = {{"Q4_K", mvtc::SB_WORDS, mvtc::SB_SUMS, 7},
                                  {"Q8_0", mvtc8::G_WORDS, mvtc8::G_FACT, 5},
                                  {"Q6_K", mvtc6::SB_WORDS, 1, 4}};

// The production prep kernel of layout f over `rows` rows of n at x (grid (n / 256, rows), one
// warp per block), or with ref, the former 256-thread kernel: words then sums of all rows.
static std::vector<uint32_t> prep_kernel(int f, const float* x, int rows, int n, bool ref) {
    const size_t units = (size_t)rows * (n / 256), nw = units * LAYOUTS[f].words, ns = units * LAYOUTS[f].sums;
    uint32_t* buf = dev_alloc<uint32_t>(nw + ns);
    float* sums = reinterpret_cast<float*>(buf + nw);
    const dim3 grid(n / 256, rows), block(ref ? 256 : 32);
    pf_emu::launch(grid, block, 0, pf_emu::EARLY, [&] {
        if (f == 0) mvtc::prep_x_body(mvtc::PrepArgs{x, buf, sums});
        else if (f == 1 && ref) ref_prep::q80(mvtc8::PrepArgs{x, buf, sums});
        else if (f == 1) mvtc8::prep_x_body(mvtc8::PrepArgs{x, buf, sums});
        else if (ref) ref_prep::q6k(mvtc6::PrepArgs{x, buf, sums});
        else mvtc6::prep_x_body(mvtc6::PrepArgs{x, buf, sums});
    });
    std::vector<uint32_t> v(buf, buf + nw + ns);
    dev_free(buf);
    return v;
}

static int differ(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    if (a.size() != b.size()) return -1;
    int bad = 0;
    for (size_t i = 0; i < a.size(); i++) bad += a[i] != b[i];
    return bad;
}

// The warp prep kernel of an int8 layout against the former one: rows of n of x kind `xkind`
// (4: a NaN, 5: an inf in the first row), bit for bit.
static void check_warp_prep(int f, int rows, int n, int xkind) {
    std::vector<float> hx = xkind < 4 ? make_x(xkind, rows * n) : x_with(xkind, rows * n);
    float* x = dev_alloc<float>(hx.size());
    memcpy(x, hx.data(), 4 * hx.size());
    const int bad = differ(prep_kernel(f, x, rows, n, false), prep_kernel(f, x, rows, n, true));
    dev_free(x);
    g_checks++;
    if (bad) g_fail++;
    printf("%s %s warp prep, %d rows of %5d, x kind %d: %d words or scales differ from the 256-thread prep\n",
           bad ? "FAIL" : "ok  ", LAYOUTS[f].name, rows, n, xkind, bad);
}

// Threads per row of a decode-shaped norm (src/backend/cuda/ops/norm.rs norm_threads, few groups).
static int norm_threads(int n) {
    const int base = std::min(std::max((n + 31) / 32 * 32, 32), 256);
    return std::max(base, std::min(std::max(((n + 3) / 4 + 31) / 32 * 32, 32), 1024));
}

enum NormKernel { RMS, ADD_RMS, GATED_ROWS, SIGMOID_ROWS };
static const char* NORM_NAMES[] = {"rms_norm", "add_rms_norm", "gated_rms_norm_rows", "sigmoid_mul_rows"};

// Kernel k over `rows` token rows of n values, asked for the layouts in `mask` (bit f: LAYOUTS[f]):
// each prepared copy must equal what the prep kernel makes of the kernel's own output, bit for
// bit; with n not a multiple of 256 the kernel must leave the slots' memory untouched. `xkind`:
// the input values (sigmoid_mul_rows with a gate of 100, sigmoid exactly 1, passes them through:
// the preps then see every make_x extreme, NaN and inf).
static void check_norm_prep(NormKernel k, int rows, int n, unsigned mask, int xkind) {
    const size_t total = (size_t)rows * n;
    const int dg = k == GATED_ROWS ? 128 : n;  // the gated norm's group (a head)
    std::vector<float> hx = xkind < 4 ? make_x(xkind, total) : x_with(xkind, total), hz = make_x(0, total),
                       hw = make_x(0, dg), hacc = make_x(0, total);
    if (k != SIGMOID_ROWS)
        for (auto& v : hx) v = std::isfinite(v) && std::fabs(v) < 1e10f && std::fabs(v) > 1e-10f ? v : 0.5f;
    if (k == SIGMOID_ROWS)
        for (auto& v : hz) v = 100.0f;
    float* x = dev_alloc<float>(total);
    float* z = dev_alloc<float>(total);
    float* w = dev_alloc<float>(dg);
    float* acc = dev_alloc<float>(total);
    float* out = dev_alloc<float>(total);
    memcpy(x, hx.data(), 4 * total), memcpy(z, hz.data(), 4 * total), memcpy(w, hw.data(), 4 * dg);
    memcpy(acc, hacc.data(), 4 * total);
    // Slot memory: a whole layout when n allows one, else a canary (must stay 0xff bytes).
    const size_t units = (size_t)rows * (n / 256);
    uint32_t* slot[3] = {nullptr, nullptr, nullptr};
    size_t slot_words[3] = {0, 0, 0};
    Args a;
    memset(&a, 0, sizeof a);
    for (int f = 0; f < 3; f++)
        if (mask >> f & 1) {
            slot_words[f] = n % 256 ? 1024 : units * (LAYOUTS[f].words + LAYOUTS[f].sums);
            slot[f] = dev_alloc<uint32_t>(slot_words[f]);
            a.p[LAYOUTS[f].slot] = (unsigned long long)slot[f];
        }
    const int threads = norm_threads(n);
    const size_t smem = (mask & 2) ? (size_t)(threads / 32) * mvtc8::IMG_WORDS * 4 : 0;
    a.f[0] = 1e-6f;
    float* result = out;
    switch (k) {
        case RMS:
            a.p[0] = (unsigned long long)x, a.p[1] = (unsigned long long)w, a.p[2] = (unsigned long long)out;
            a.n[0] = n;
            pf_emu::launch(dim3(rows), dim3(threads), smem, pf_emu::EARLY, [&] { rms_norm(a); });
            break;
        case ADD_RMS:
            a.p[0] = (unsigned long long)acc, a.p[1] = (unsigned long long)x, a.p[2] = (unsigned long long)w;
            a.p[3] = (unsigned long long)out;
            a.n[0] = n;
            pf_emu::launch(dim3(rows), dim3(threads), smem, pf_emu::EARLY, [&] { add_rms_norm(a); });
            break;
        case GATED_ROWS:
            a.p[0] = (unsigned long long)x, a.p[1] = (unsigned long long)z, a.p[2] = (unsigned long long)w;
            a.p[3] = (unsigned long long)out;
            a.n[0] = dg, a.n[1] = n;
            pf_emu::launch(dim3(rows), dim3(threads), smem, pf_emu::EARLY, [&] { gated_rms_norm_rows(a); });
            break;
        case SIGMOID_ROWS:
            a.p[0] = (unsigned long long)x, a.p[1] = (unsigned long long)z;
            a.n[1] = n;
            pf_emu::launch(dim3(rows), dim3(threads), smem, pf_emu::EARLY, [&] { sigmoid_mul_rows(a); });
            result = x;
            break;
    }
    int bad = 0;
    for (int f = 0; f < 3; f++) {
        if (!(mask >> f & 1)) continue;
        const std::vector<uint32_t> got(slot[f], slot[f] + slot_words[f]);
        if (n % 256) {
            for (uint32_t v : got) bad += v != 0xffffffffu;
        } else {
            const int d = differ(got, prep_kernel(f, result, rows, n, false));
            bad += d < 0 ? 1 : d;
        }
        dev_free(slot[f]);
    }
    dev_free(x), dev_free(z), dev_free(w), dev_free(acc), dev_free(out);
    g_checks++;
    if (bad) g_fail++;
    std::string fmts;
    for (int f = 0; f < 3; f++)
        if (mask >> f & 1) fmts += std::string(fmts.empty() ? "" : "+") + LAYOUTS[f].name;
    printf("%s %-19s %d rows of %5d, %4d threads, %-14s x kind %d: %d words or sums %s\n", bad ? "FAIL" : "ok  ",
           NORM_NAMES[k], rows, n, threads, fmts.c_str(), xkind, bad,
           n % 256 ? "written (want none: not a multiple of 256)" : "differ from the prep kernels'");
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
// `acc`: the kernel adds its rows into the outputs (n11 bit 5, matmul_add_rms_norm's residual add).
template <class F, int R, int KW, bool DENSE, bool PIPE = false>
static void launch_body(const std::vector<int>& idx, const std::vector<uint8_t*>& w, const std::vector<float*>& out,
                        const std::vector<int>& rows, const TcPrep& x, int T, int n_in, size_t rb, bool swap = false,
                        bool acc = false) {
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
    a.n[11] = (PIPE ? 8 : 0) | (acc ? 32 : 0);  // 8: the first step loaded before the (emulated) wait
    pf_emu::launch(dim3(blocks, T), dim3(32 * KW), 0, pf_emu::EARLY,
                   [&] { mvtc::mv_body<F, R, KW, false, DENSE, false, PIPE>(a); });
}

// `swap`: a broken segment table (two products' weights exchanged), which must be caught. PIPE:
// the double-buffered loads (matvec_tc.cuh rows_db), whose products alone must also equal the
// plain loop's bit for bit.
template <class F, int R, int KW, bool DENSE, bool PIPE = false>
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
    int unlike_plain = 0;
    for (int i = 0; i < n; i++) {
        launch_body<F, R, KW, DENSE, PIPE>({i}, w, alone, rows, xp, T, n_in, rb);
        all.push_back(i);
        if (PIPE) {
            // The same product through the plain loop (into `grouped`, overwritten below).
            launch_body<F, R, KW, DENSE, false>({i}, w, grouped, rows, xp, T, n_in, rb);
            unlike_plain += memcmp(alone[i], grouped[i], 4 * (size_t)T * rows[i]) != 0;
        }
    }
    // Each product added into a residual (n11 bit 5): bit for bit the residual plus its own
    // launch's values, one f32 addition (the CPU reference's add_assign).
    int unlike_add = 0;
    for (int i = 0; i < n && !swap; i++) {
        const std::vector<float> r = make_x(0, T * rows[i]);
        memcpy(grouped[i], r.data(), 4 * r.size());
        launch_body<F, R, KW, DENSE, PIPE>({i}, w, grouped, rows, xp, T, n_in, rb, false, true);
        for (size_t j = 0; j < r.size(); j++) {
            const float want = r[j] + alone[i][j];
            unlike_add += memcmp(&want, &grouped[i][j], 4) != 0;
        }
    }
    launch_body<F, R, KW, DENSE, PIPE>(all, w, grouped, rows, xp, T, n_in, rb, swap);
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
    const bool ok = wrong == 0 && unlike_plain == 0 && unlike_add == 0 && (swap ? bad > 0 : bad == 0);
    g_checks++;
    if (!ok) g_fail++;
    printf("%s mvtc group %-9s%s%s rows %-16s n_in %5d T %d: %d of %d differ from their own launch%s; alone: worst "
           "%.2e%s\n",
           ok ? "ok  " : "FAIL", name, PIPE ? " pipe" : "", swap ? " MUTATION weights swapped" : "", desc.c_str(), n_in,
           T, bad, n, swap ? " (must be > 0)" : "", worst,
           PIPE ? (", " + std::to_string(unlike_plain) + " differ from the plain loop's").c_str() : "");
    if (unlike_add) printf("     %d values added into a residual differ from residual + product\n", unlike_add);
    fflush(stdout);
    for (int i = 0; i < n; i++) dev_free(w[i]), dev_free(alone[i]), dev_free(grouped[i]);
    dev_free(x), dev_free(xp.xa), dev_free(xp.xs);
}

// Q4_K_M's mixed launch (matvec_tc6.cu mvtc_mix_Q6_K_Q4_K): one Q6_K product (segment 0, its x
// at p4 / p5, its row bytes in n10, its blocks first: n9) and Q4_K products after it, each bit for
// bit its own launch (R = 1, KW = 8) and within the f64 bound.
static void check_mixed(int q6_rows, std::vector<int> q4_rows, int n_in, int T) {
    const std::vector<float> hx = make_x(0, T * n_in);
    float* x = dev_alloc<float>((size_t)T * n_in);
    memcpy(x, hx.data(), 4 * hx.size());
    const TcPrep x6 = prep_tc(host::Q6K, x, T, n_in), x4 = prep_tc(host::Q4K, x, T, n_in);
    std::vector<int> rows = {q6_rows};
    rows.insert(rows.end(), q4_rows.begin(), q4_rows.end());
    const int n = (int)rows.size();
    std::vector<std::vector<uint8_t>> hw(n);
    std::vector<uint8_t*> w(n);
    std::vector<float*> alone(n), mixed(n);
    std::vector<size_t> rb(n);
    for (int i = 0; i < n; i++) {
        hw[i] = i == 0 ? random_q6k(rows[i], n_in) : random_q4k(rows[i], n_in);
        rb[i] = hw[i].size() / rows[i];
        w[i] = dev_alloc<uint8_t>(hw[i].size());
        memcpy(w[i], hw[i].data(), hw[i].size());
        alone[i] = dev_alloc<float>((size_t)T * rows[i]);
        mixed[i] = dev_alloc<float>((size_t)T * rows[i]);
    }
    launch_body<mvtc6::TcQ6K, 1, 8, true>({0}, w, alone, rows, x6, T, n_in, rb[0]);
    for (int i = 1; i < n; i++) launch_body<mvtc::TcQ4K, 1, 8, true>({i}, w, alone, rows, x4, T, n_in, rb[1]);
    ::Args a;
    memset(&a, 0, sizeof a);
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        a.seg[i] = MvSeg{(unsigned long long)w[i], (unsigned long long)mixed[i], rows[i], blocks};
        blocks += (rows[i] + 15) / 16;
    }
    a.p[2] = (unsigned long long)x4.xa;
    a.p[6] = (unsigned long long)x4.xs;
    a.p[4] = (unsigned long long)x6.xa;
    a.p[5] = (unsigned long long)x6.xs;
    a.n[1] = n_in;
    a.n[2] = (long long)rb[1];
    a.n[4] = a.n[5] = a.n[6] = 1;
    a.n[9] = (rows[0] + 15) / 16;
    a.n[10] = (long long)rb[0];
    pf_emu::launch(dim3(blocks, T), dim3(256), 0, pf_emu::EARLY, [&] {
        if ((long long)blockIdx.x < a.n[9])
            mvtc::mv_body<mvtc6::TcQ6K, 1, 8, false, true, false, false, true>(a);
        else
            mvtc::mv_body<mvtc::TcQ4K, 1, 8, false, true>(a);
    });
    int bad = 0, wrong = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        bad += memcmp(alone[i], mixed[i], 4 * (size_t)T * rows[i]) != 0;
        for (int t = 0; t < T; t++) {
            int wr, finite;
            const double e = worst_err(i == 0 ? host::Q6K : host::Q4K, hw[i], hx.data() + (size_t)t * n_in,
                                       mixed[i] + (size_t)t * rows[i], rows[i], n_in, wr, finite);
            worst = std::max(worst, e);
            wrong += !(e <= 1e-5);
        }
    }
    const bool ok = bad == 0 && wrong == 0;
    g_checks++;
    if (!ok) g_fail++;
    printf("%s mvtc mixed Q6_K %d + Q4_K %zu products n_in %d T %d: %d of %d differ from their own launch, worst %.2e\n",
           ok ? "ok  " : "FAIL", q6_rows, q4_rows.size(), n_in, T, bad, n, worst);
    fflush(stdout);
    for (int i = 0; i < n; i++) dev_free(w[i]), dev_free(alone[i]), dev_free(mixed[i]);
    dev_free(x), dev_free(x6.xa), dev_free(x6.xs), dev_free(x4.xa), dev_free(x4.xs);
}

// The fused SwiGLU (mv_body with GLU) of T dense vectors at geometry R, KW, against the f64
// reference silu(g x) (u x): |err| <= 1e-5 (|u x| sum|g x| + |silu(g x)| sum|u x|) per output.
// `swap`: the two weights exchanged (must fail).
// F, fmt: the format's policy and host type (TcQ4K / Q4K, TcQ80 / Q80).
template <int R, int KW, bool PIPE = false, class F = mvtc::TcQ4K>
static void check_glu(int n_out, int n_in, int T, int xkind, bool swap = false, int fmt = host::Q4K) {
    const auto hg = fmt == host::Q4K ? random_q4k(n_out, n_in) : random_q80(n_out, n_in);
    const auto hu = fmt == host::Q4K ? random_q4k(n_out, n_in) : random_q80(n_out, n_in);
    const size_t rb = hg.size() / n_out;
    const std::vector<float> hx = make_x(xkind, T * n_in);
    uint8_t *g = dev_alloc<uint8_t>(hg.size()), *u = dev_alloc<uint8_t>(hu.size());
    memcpy(g, hg.data(), hg.size()), memcpy(u, hu.data(), hu.size());
    float* x = dev_alloc<float>(hx.size());
    memcpy(x, hx.data(), hx.size() * 4);
    float* out = dev_alloc<float>((size_t)T * n_out);
    const TcPrep xp = prep_tc(fmt, x, T, n_in);
    ::Args a;
    memset(&a, 0, sizeof a);
    a.seg[0] = MvSeg{(unsigned long long)(swap ? u : g), (unsigned long long)out, n_out, 0};
    a.p[1] = (unsigned long long)(swap ? g : u), a.p[2] = (unsigned long long)xp.xa, a.p[6] = (unsigned long long)xp.xs;
    a.n[1] = n_in, a.n[2] = (long long)rb, a.n[4] = 1, a.n[5] = 1, a.n[6] = 1;
    a.n[11] = PIPE ? 8 | 16 : 0;  // the first step before the wait, the up matrix's during the gate's last
    pf_emu::launch(dim3((n_out + 16 * R - 1) / (16 * R), T), dim3(32 * KW), 0, pf_emu::EARLY,
                   [&] { mvtc::mv_body<F, R, KW, true, false, false, PIPE>(a); });
    std::vector<float> yg(n_in), yu(n_in);
    double worst = 0;
    for (int o = 0; o < n_out; o++) {
        host::deq_row(fmt, hg.data() + (size_t)o * rb, n_in, yg.data());
        host::deq_row(fmt, hu.data() + (size_t)o * rb, n_in, yu.data());
        for (int t = 0; t < T; t++) {
            double sg = 0, su = 0, mg = 0, mu = 0;
            for (int i = 0; i < n_in; i++) {
                const double xi = hx[(size_t)t * n_in + i];
                sg += yg[i] * xi, su += yu[i] * xi, mg += fabs(yg[i] * xi), mu += fabs(yu[i] * xi);
            }
            const double sil = sg / (1.0 + exp(-sg)), ref = sil * su;
            const double mag = fabs(su) * mg + fabs(sil) * mu + 1e-300;
            const double e = fabs((double)out[(size_t)t * n_out + o] - ref) / mag;
            worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
    }
    const bool pass = worst <= 1e-5;
    const bool ok = swap ? !pass : pass;
    g_checks++;
    if (!ok) g_fail++;
    printf("%s mvtc glu   %s R=%d KW=%d%s%s rows %d n_in %d T %d %s: worst |err| / magnitude %.2e%s\n",
           ok ? "ok  " : "FAIL", fmt == host::Q4K ? "q4k" : "q80", R, KW, PIPE ? " pipe" : "", swap ? " MUTATION weights swapped" : "", n_out, n_in, T,
           KINDS[xkind], worst,
           swap ? " (must exceed the bound)" : "");
    fflush(stdout);
    dev_free(g), dev_free(u), dev_free(x), dev_free(out), dev_free(xp.xa), dev_free(xp.xs);
}

// ---------------------------------------------------------------------------------------------
// The production body (matvec_tc.cuh mv_body) with a MoE layer's shared expert as expert k of
// each token's k + 1 (the `_sh_` kernels, common.cuh MvShared), against the composition the
// backend runs without them: the routed experts (the MoE kernels: gate/up rows, a k-way down sum),
// the shared expert's SwiGLU and down products (the dense kernels) and out += sigmoid(gate logit)
// * shared. The gate/up rows are the same arithmetic: bit for bit. The down sums take the shared
// term inside the sum (other rounding): within the bound of the composition and of the f64
// reference (|err| <= 1e-5 sum |w h| per output).

// One launch of the production kernels' body (R = 1, KW = 8: mvtc_, mvtc_glu_ and their `_sh_`
// forms), the slots as src/backend/cuda/ops/matvec_tc.rs fills them.
struct MoeLaunch {
    const uint8_t *w, *w2 = nullptr;
    TcPrep x;
    float* out;
    const uint32_t* ids = nullptr;
    const float* scales = nullptr;
    int n_out, n_in;
    size_t rb, expert_bytes = 0;
    int n_experts = 1, x_group = 1, nsum = 1, vectors;
    const uint8_t* sh = nullptr;  // p7
    const void* sh2 = nullptr;    // p3
};
template <class F, bool GLU, bool SHARED>
static void launch_moe(const MoeLaunch& m) {
    ::Args a;
    memset(&a, 0, sizeof a);
    a.seg[0] = MvSeg{(unsigned long long)m.w, (unsigned long long)m.out, m.n_out, 0};
    a.p[1] = (unsigned long long)m.w2, a.p[2] = (unsigned long long)m.x.xa;
    a.p[3] = (unsigned long long)m.sh2, a.p[4] = (unsigned long long)m.ids, a.p[5] = (unsigned long long)m.scales;
    a.p[6] = (unsigned long long)m.x.xs, a.p[7] = (unsigned long long)m.sh;
    a.n[1] = m.n_in, a.n[2] = (long long)m.rb, a.n[3] = (long long)m.expert_bytes;
    a.n[4] = m.n_experts, a.n[5] = m.x_group, a.n[6] = m.nsum;
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
        T_* p = dev_alloc<T_>(v.size() + 64);  // the backend's weight padding (buffer.rs WEIGHT_PAD)
        memcpy(p, v.data(), v.size() * sizeof(T_));
        memset(p + v.size(), 0, 64 * sizeof(T_));
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
    const TcPrep xp = prep_tc(fmt, x, T, d);
    // The composition.
    launch_moe<F, true, false>({g, u, xp, hr, ids, nullptr, f, d, rbg, f * rbg, E, k, 1, T * k});
    launch_moe<F, true, false>({gs, us, xp, hs, nullptr, nullptr, f, d, rbg, 0, 1, 1, 1, T});
    const TcPrep hrp = prep_tc(fmt, hr, T * k, f), hsp = prep_tc(fmt, hs, T, f);
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
    const TcPrep hfp = prep_tc(fmt, hf, T * (k + 1), f);
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
    for (const TcPrep& p : {xp, hrp, hsp, hfp}) dev_free(p.xa), dev_free(p.xs);
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

    // The warp preps of the int8 layouts against the former 256-thread kernels, bit for bit.
    for (int f = 1; f < 3; f++) {
        for (int k = 0; k < 6; k++) check_warp_prep(f, 2, 2048, k);
        check_warp_prep(f, 3, 768, 3);
    }
    // The kernels that prepare their own output rows: every layout, alone and together; rows of
    // 4096 (one task per warp and layout at 1024 threads: two or three rounds with several
    // layouts), 2560 (10 super-blocks), 768; rows that are not a multiple of 256 prepare nothing.
    for (int k = RMS; k <= SIGMOID_ROWS; k++) {
        const NormKernel nk = (NormKernel)k;
        check_norm_prep(nk, 1, 4096, 7u, 0);
        check_norm_prep(nk, 3, 2560, 7u, 2);
        check_norm_prep(nk, 2, 2048 + 128, 7u, 0);
        check_norm_prep(nk, 1, 2048 + 200, 7u, 0);
    }
    for (unsigned m = 1; m < 7; m++) check_norm_prep(RMS, 2, 2048, m, 1);
    check_norm_prep(ADD_RMS, 4, 768, 3u, 0);
    for (int k = 0; k < 6; k++) check_norm_prep(SIGMOID_ROWS, 2, 2048, 7u, k);

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
    check_mixed(40, {33, 7, 1}, 2048, 3);
    check_mixed(17, {70}, 4096, 1);
    check_group<mvtc::TcQ4K, 1, 8, false>("q4k", host::Q4K, {32, 32}, 512, 1, true);
    // The double-buffered body (mvtc_tall_Q8_0, mvtc_mid_Q8_0, mvtc_Q8_0; Q4_K's policy too, which
    // matvec_bench times): one step per warp or fewer (n_in 256 .. 2048 on 8 warps), several steps
    // (4096 on 4 warps: 4), warps without a step (n_in 256).
    check_group<mvtc::TcQ4K, 2, 4, true, true>("q4k tall", host::Q4K, {4104, 32, 33}, 256, 1);
    check_group<mvtc::TcQ4K, 2, 4, true, true>("q4k tall", host::Q4K, {33, 1, 64, 17}, 4096, 2);
    check_group<mvtc::TcQ4K, 1, 8, false, true>("q4k", host::Q4K, {32, 33, 1, 70}, 3072, 3);
    check_group<mvtc8::TcQ80, 2, 4, true, true>("q80 tall", host::Q80, {4104, 33, 32, 1}, 4096, 1);
    check_group<mvtc8::TcQ80, 2, 8, true, true>("q80 mid", host::Q80, {70, 33}, 2560, 2);
    check_group<mvtc8::TcQ80, 1, 8, false, true>("q80", host::Q80, {17, 32, 33}, 512, 3);
    check_group<mvtc8::TcQ80, 1, 8, false, true>("q80", host::Q80, {32, 32}, 512, 1, true);

    // The fused SwiGLU at both production geometries (mvtc_glu_, mvtc_glu_tall_): a partial last
    // tile (rows 16 * 37 + 8), several vectors.
    for (int k = 0; k < 3; k++) {
        check_glu<1, 8>(600, 2048, 2, k);
        check_glu<2, 4>(600, 2048, 2, k);
    }
    check_glu<2, 4>(256, 1024, 1, 0, true);
    // The same with double-buffered loads (mvtc_glu_tall_Q8_0's body; the second matrix starts its
    // own buffer).
    check_glu<2, 4, true>(600, 3072, 2, 1);
    check_glu<1, 8, true>(600, 2048, 2, 2);
    // mvtc_glu_tall_Q8_0 (R = 1, KW = 4, double-buffered), and a weights swap it must catch.
    for (int k = 0; k < 3; k++) check_glu<1, 4, true, mvtc8::TcQ80>(600, 3072, 2, k, false, host::Q80);
    check_glu<1, 4, true, mvtc8::TcQ80>(256, 1024, 1, 0, true, host::Q80);

    // The shared expert in the production kernels: several tokens, the 35B-A3B's k = 8.
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 6, 3, 3, 512, 256);
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 12, 8, 1, 256, 256);
    // Rows of 512 (the 35B-A3B's downs: 2 super-blocks, the warps split over 4 groups of entries)
    // and of 768 (3 super-blocks: no split).
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 12, 8, 2, 256, 512);
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 5, 4, 1, 256, 768);
    check_shared<mvtc8::TcQ80>("q80", host::Q80, 10, 8, 1, 512, 1024);
    check_shared<mvtc8::TcQ80>("q80", host::Q80, 6, 3, 2, 256, 512);
    check_shared<mvtc6::TcQ6K>("q6k", host::Q6K, 3, 2, 1, 2048, 2048);
    // The shared-expert kernels' Q6_K policy (rows realigned at run time): the 35B-A3B's down rows
    // of 420 bytes (the warps split over the entries), rows of 3 super-blocks, and 16-byte rows.
    check_shared<mvtc6::TcQ6KAny>("q6k any", host::Q6K, 12, 8, 2, 512, 512);
    check_shared<mvtc6::TcQ6KAny>("q6k any", host::Q6K, 6, 3, 1, 768, 256);
    check_shared<mvtc6::TcQ6KAny>("q6k any", host::Q6K, 3, 2, 1, 2048, 2048);
    check_shared<mvtc::TcQ4K>("q4k", host::Q4K, 6, 3, 2, 256, 256, true);

    printf("%s: %d of %d mvtc checks failed\n", g_fail ? "FAIL" : "PASS", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
