// mvtc_checks.cpp: kernels-cuda/matvec_tc.cuh (tensor-core Q4_K matvec, strict tier) run on the CPU
// emulator (pf_emu.h: every CUDA thread a coroutine, mma.sync / shuffles as warp collectives per
// the PTX fragment layouts) against a double-precision dot product of the dequantized rows, at the
// bound matvec_bench.cu applies to every exact kernel: |got - want| <= 1e-5 * sum |w x| per row.
// The emulator also aborts if any HFMA2 of the weight decode is inexact (the design relies on it)
// and, under AddressSanitizer, on any read past the weights or the x buffers.
// Build and run: bash dev/cuda/emu/run-emu.sh mvtc
#define PF_EMU 1
#include <cstdarg>
#include <string>
#include <vector>

#include "matvec_tc.cuh"
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

template <int R, int KW>
static void check(const char* what, int n_out, int n_in, int xkind) {
    const std::vector<uint8_t> hw = random_q4k(n_out, n_in);
    const std::vector<float> hx = make_x(xkind, n_in);
    const size_t rb = (size_t)(n_in / 256) * 144, nsb = n_in / 256;
    uint8_t* w = dev_alloc<uint8_t>(hw.size());
    memcpy(w, hw.data(), hw.size());
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xa = dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS);
    float* xs = dev_alloc<float>(nsb * mvtc::SB_SUMS);
    float* out = dev_alloc<float>(n_out);
    pf_emu::launch(dim3(nsb), dim3(256), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, xa, xs}); });
    const mvtc::Args a{w, xa, xs, out, n_out, n_in, rb};
    pf_emu::launch(dim3((n_out + 16 * R - 1) / (16 * R)), dim3(32 * KW), 0, pf_emu::EARLY,
                   [&] { mvtc::q4k_body<R, KW>(a); });
    double worst = 0;
    int wr = 0;
    std::vector<float> y(256);
    for (int r = 0; r < n_out; r++) {
        double s = 0, mag = 0;
        for (size_t b = 0; b < nsb; b++) {
            host::deq_q4k(hw.data() + r * rb + b * 144, y.data());
            for (int i = 0; i < 256; i++) {
                s += (double)y[i] * hx[b * 256 + i];
                mag += fabs((double)y[i] * hx[b * 256 + i]);
            }
        }
        const double e = fabs((double)out[r] - s) / (mag > 0 ? mag : 1e-300);
        if (!(e <= worst)) {
            worst = std::isnan(e) ? INFINITY : e;
            wr = r;
        }
    }
    g_checks++;
    const bool ok = worst <= 1e-5;
    if (!ok) g_fail++;
    printf("%s mvtc q4k R=%d KW=%d %-28s %5dx%-5d worst |err| / sum|w x| = %.2e (row %d)\n", ok ? "ok  " : "FAIL", R, KW,
           what, n_out, n_in, worst, wr);
    fflush(stdout);
    dev_free(w);
    dev_free(x);
    dev_free(xa);
    dev_free(xs);
    dev_free(out);
}

// prep_row (the RMSNorms' in-kernel prep: one block of `threads` per row, 256 per super-block)
// writes the same words and sums as prep_x_body (one block per super-block), bit for bit.
static void check_prep_row(int threads, int n_in, int xkind) {
    const std::vector<float> hx = make_x(xkind, n_in);
    const size_t nsb = n_in / 256;
    float* x = dev_alloc<float>(n_in);
    memcpy(x, hx.data(), 4 * n_in);
    uint32_t* xa[2] = {dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS), dev_alloc<uint32_t>(nsb * mvtc::SB_WORDS)};
    float* xs[2] = {dev_alloc<float>(nsb * mvtc::SB_SUMS), dev_alloc<float>(nsb * mvtc::SB_SUMS)};
    pf_emu::launch(dim3(nsb), dim3(256), 0, pf_emu::EARLY, [&] { mvtc::prep_x_body(mvtc::PrepArgs{x, xa[0], xs[0]}); });
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

int main() {
    const char* kinds[] = {"x uniform", "x per-sub-block 2^+-30/0/tiny", "x per-element 2^-40..2^20",
                           "x 1e36/subnormal/zero/outlier"};
    for (int k = 0; k < 4; k++) {
        check<2, 4>(kinds[k], 40, 2048, k);   // 40 rows: the last tile half past the end
        check<1, 8>(kinds[k], 24, 1536, k);   // 6 super-blocks over 8 warps: two warps idle
    }
    check<4, 4>(kinds[0], 64, 4096, 0);
    check<4, 2>(kinds[2], 33, 2560, 2);
    check_prep_row(1024, 4096, 0);  // 4 groups, 4 rounds
    check_prep_row(1024, 2560, 2);  // 10 super-blocks: groups idle in the last round
    check_prep_row(512, 2048, 3);
    check_prep_row(256, 768, 1);
    printf("%s: %d of %d mvtc checks failed\n", g_fail ? "FAIL" : "PASS", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
