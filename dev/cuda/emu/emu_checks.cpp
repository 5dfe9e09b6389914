// emu_checks.cpp: the prefill kernels of kernels-cuda/, compiled as host C++ and run on the CPU
// emulator (pf_emu.h), against the same f64 references as the GPU harness. Catches indexing,
// fragment-layout, masking, pipeline (copy-early / copy-late) and bounds (AddressSanitizer)
// errors without a GPU; says nothing about speed. Build and run: dev/cuda/emu/run-emu.sh.
//
//   emu_checks [deq|gemm|attn|delta|moe|all]
#define PF_EMU 1
#include "../../../kernels-cuda/delta_chunked.cu"
#include "../../../kernels-cuda/flash_attn.cu"
#include "../../../kernels-cuda/gemm_q.cu"
#include "../../../kernels-cuda/moe_group.cu"
#include "../pf_ref.h"
#include "../pf_gemm_host.h"

using namespace host;
using pf_emu::EARLY;
using pf_emu::LATE;

static int g_fail = 0;
static void report(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (!ok) g_fail++;
}

using pf_emu::dev_alloc;
using pf_emu::dev_free;

// Random weight rows in format fmt with sane f16 scales (as the GPU harness generates them).
static std::vector<uint8_t> make_weights(int fmt, long long rows, long long k, uint64_t seed) {
    Rng rng(seed);
    const long long rb = row_bytes(fmt, k), n = rb * rows;
    std::vector<uint8_t> w(n);
    for (auto& b : w) b = static_cast<uint8_t>(rng.next());
    auto put_h = [&](long long at, float v) {
        const __half_raw h = __float2half_rn(v);
        w[at] = h.x & 0xff;
        w[at + 1] = h.x >> 8;
    };
    const long long nb = rows * k / FMT_QK[fmt];
    for (long long i = 0; i < nb; i++) {
        const float small = (rng.next() & 15) == 0 ? 1.0f / 256 : 1.0f;
        const float u1 = (float)(1 + rng.uni()), u2 = (float)(1 + rng.uni());
        switch (fmt) {
            case Q4K: put_h(144 * i, u1 * 0x1p-13f * small); put_h(144 * i + 2, u2 * 0x1p-13f * small); break;
            case Q5K: put_h(176 * i, u1 * 0x1p-14f * small); put_h(176 * i + 2, u2 * 0x1p-14f * small); break;
            case Q6K: put_h(210 * i + 208, u1 * 0x1p-14f * small); break;
            case Q80: put_h(34 * i, u1 * 0x1p-11f * small); break;
            case F16: put_h(2 * i, (float)((rng.uni() * 2 - 1) * 0.1)); break;
            case BF16: {
                const float v = (float)((rng.uni() * 2 - 1) * 0.1);
                uint32_t u;
                memcpy(&u, &v, 4);
                u += 0x7fffu + ((u >> 16) & 1u);
                w[2 * i] = (u >> 16) & 0xff;
                w[2 * i + 1] = u >> 24;
            } break;
        }
    }
    return w;
}

// ---------------------------------------------------------------- dequantization units
template <int FMT>
static void deq_check(int fmt) {
    using F = pf::FmtInfo<FMT>;
    const int K = 1024, ROWS = 8;
    const std::vector<uint8_t> w = make_weights(fmt, ROWS, K, 7 + fmt);
    const long long rb = row_bytes(fmt, K);
    long long n = 0, mism = 0, big = 0;
    for (int shift = 0; shift < (F::ALIGNED ? 2 : 16); shift += 2) {
        // The tensor placed `shift` bytes past a 16-byte boundary (aligned formats: 0 only).
        const int sh = F::ALIGNED ? 0 : shift;
        std::vector<uint8_t> buf(rb * ROWS + 64 + 16);
        uint8_t* base = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) % 16) % 16;
        memcpy(base + sh, w.data(), rb * ROWS);
        for (int r = 0; r < ROWS; r++) {
            std::vector<float> ref(K);
            deq_row(fmt, w.data() + r * rb, K, ref.data());
            const uint8_t* row = base + sh + r * rb;
            for (int ss = 0; ss < K / 64 / F::RS; ss++) {
                const uint8_t* start = row + (long long)ss * F::SB;
                const int off = static_cast<int>(reinterpret_cast<uintptr_t>(start) & 15);
                const int len = F::SB;
                alignas(16) uint8_t raw[F::RAWB];
                memset(raw, 0xee, sizeof raw);
                for (int ch = 0; ch < F::NCH; ch++) {
                    if (ch * 16 < off + len) memcpy(raw + ch * 16, start - off + ch * 16, 16);
                    else memset(raw + ch * 16, 0, 16);
                }
                for (int sub = 0; sub < F::RS; sub++)
                    for (int kk = 0; kk < 4; kk++) {
                        uint4 o[2];
                        pf::Deq<FMT>::unit(raw, F::ALIGNED ? 0 : off, sub, kk, o[0], o[1]);
                        const uint16_t* h = reinterpret_cast<const uint16_t*>(o);
                        for (int i = 0; i < 16; i++) {
                            const int e = (ss * F::RS + sub) * 64 + kk * 16 + i;
                            const __half_raw want = __float2half_rn(ref[e]);
                            n++;
                            if (h[i] != want.x) {
                                mism++;
                                if (std::abs((int)h[i] - (int)want.x) > 1) big++;
                            }
                        }
                    }
            }
        }
    }
    // The kernels form d*q - m with one fma (ggml rounds the product first): the f16 result may
    // differ by one f16 ulp where the f32 value sits on an f16 rounding boundary; never more.
    report(big == 0 && mism * 1000 <= n, "dequant %-5s: %lld values, %lld differ from f16(ggml f32) by 1 ulp, %lld by more",
           FMT_NAME[fmt], n, mism - big, big);
}

// ---------------------------------------------------------------- GEMM
// y = f16(x) and, with lo, lo = f16(x - y) (the split formats' second plane).
static void emu_f32_to_f16(const float* x, __half* y, long long n, pf_emu::CopyMode mode, __half* lo = nullptr) {
    pf_emu::launch(dim3(2), dim3(64), 0, mode, [&] { pf_f32_to_f16(pf::CvtParams{x, y, lo, n}); });
}
static void emu_gemm(int fmt, int cfg, int splits, const uint8_t* w, long long rb, const __half* x, const __half* x_lo,
                     long long ldx, const int* xrows, float* y, int rows, int n, int k, pf_emu::CopyMode mode) {
    const int nsteps = k / 64, per = steps_per_split(fmt, nsteps, splits);
    float* ws = splits > 1 ? dev_alloc<float>((size_t)splits * rows * n) : nullptr;
    const pf::GemmParams p = gemm_params(w, rb, x, x_lo, ldx, xrows, y, rows, n, k, per, ws);
    const dim3 grid((n + CFG[cfg].bn - 1) / CFG[cfg].bn, (rows + CFG[cfg].bm - 1) / CFG[cfg].bm, (nsteps + per - 1) / per);
    pf_emu::launch(grid, dim3(CFG[cfg].nth), SMEM[fmt][cfg], mode, [&] { KERN[fmt][cfg](p); });
    if (ws) {
        pf_emu::launch(dim3(3), dim3(64), 0, mode,
                       [&] { pf_gemm_splitk_reduce(pf::ReduceParams{ws, y, n, rows, n, (int)grid.z}); });
        dev_free(ws);
    }
}

// Bounds of the GEMM checks (rel L2; max |err| / max |ref| within 4x): `tight` against the same
// products as the kernel's (accumulation order only), `exact` against the f32 operands. The
// quantized formats' exact bound is the f16-rounded tier; the split formats (F16, BF16 weights,
// x as hi + lo) must be f32-class, far inside it (an f16-rounded x gives ~3e-4 here).
static const double GEMM_TIGHT = 1e-5, GEMM_TIER = 6e-3, GEMM_SPLIT_EXACT = 2e-5;

static void gemm_checks() {
    const int N = 320, TMAX = 70;
    for (int fmt = 0; fmt < NFMT; fmt++) {
        const bool split = split_fmt(fmt);
        const int K = (fmt == Q80 || fmt == F16 || fmt == BF16) ? 832 : 768;
        const std::vector<uint8_t> wh = make_weights(fmt, N, K, 40 + fmt);
        const long long rb = row_bytes(fmt, K);
        uint8_t* w = dev_alloc<uint8_t>(wh.size());
        memcpy(w, wh.data(), wh.size());
        Rng rng(9 + fmt);
        std::vector<float> xh((size_t)TMAX * K);
        for (auto& v : xh) v = (float)(rng.uni() * 2 - 1);
        float* x = dev_alloc<float>(xh.size());
        memcpy(x, xh.data(), xh.size() * 4);
        __half* x16 = dev_alloc<__half>(xh.size());
        // The lo plane (split formats), and an all-zero one: the same kernel then computes the
        // single-plane product (W hi + W 0), the f16-rounded x that the split replaces.
        __half* x16lo = split ? dev_alloc<__half>(xh.size()) : nullptr;
        __half* zero_lo = split ? dev_alloc<__half>(xh.size()) : nullptr;
        if (split) memset(zero_lo, 0, xh.size() * 2);
        emu_f32_to_f16(x, x16, (long long)xh.size(), LATE, x16lo);
        std::vector<const float*> xr(TMAX);
        for (int t = 0; t < TMAX; t++) xr[t] = &xh[(size_t)t * K];
        const GemmRef ref = gemm_ref(fmt, wh, rb, K, xr, N);
        float* y = dev_alloc<float>((size_t)TMAX * N);
        struct Case {
            int T, cfg, splits;
            pf_emu::CopyMode mode;
        };
        std::vector<Case> cases;
        for (int cfg = 0; cfg < 3; cfg++) {
            cases.push_back({65, cfg, 1, LATE});
            cases.push_back({3, cfg, 2, EARLY});
        }
        cases.push_back({33, 2, 1, EARLY});
        cases.push_back({70, 1, 2, LATE});
        cases.push_back({20, 0, 3, LATE});
        const double exact_bound = split ? GEMM_SPLIT_EXACT : GEMM_TIER;
        for (const Case& c : cases) {
            memset(y, 0xff, (size_t)TMAX * N * 4);
            emu_gemm(fmt, c.cfg, c.splits, w, rb, x16, x16lo, K, nullptr, y, c.T, N, K, c.mode);
            Err et, ee;
            for (int t = 0; t < c.T; t++)
                for (int o = 0; o < N; o++) {
                    et.add(y[(size_t)t * N + o], ref.tight[(size_t)t * N + o]);
                    ee.add(y[(size_t)t * N + o], ref.exact[(size_t)t * N + o]);
                }
            et.finish();
            ee.finish();
            report(et.ok(GEMM_TIGHT) && ee.ok(exact_bound),
                   "gemm %-5s cfg %c split %d T=%2d copies %-5s: tight relL2 %.2e maxrel %.2e nonfinite %lld, exact relL2 %.2e "
                   "(bound %.0e)",
                   FMT_NAME[fmt], 'A' + c.cfg, c.splits, c.T, c.mode == EARLY ? "early" : "late", et.rel_l2, et.max_rel(),
                   et.nonfinite, ee.rel_l2, exact_bound);
        }
        // Split vs single plane: the same kernel with the lo plane zeroed must give the f16-rounded
        // product (tight against it) and an exact error far above the split's, or the split check
        // above would not tell the two apart.
        if (split) {
            Err es, eu, eu_f16;
            for (int pass = 0; pass < 2; pass++) {
                memset(y, 0xff, (size_t)TMAX * N * 4);
                emu_gemm(fmt, 1, 1, w, rb, x16, pass ? zero_lo : x16lo, K, nullptr, y, 65, N, K, LATE);
                for (int t = 0; t < 65; t++)
                    for (int o = 0; o < N; o++) {
                        const size_t i = (size_t)t * N + o;
                        (pass ? eu : es).add(y[i], ref.exact[i]);
                        if (pass) eu_f16.add(y[i], ref.f16[i]);
                    }
            }
            es.finish();
            eu.finish();
            eu_f16.finish();
            report(es.ok(GEMM_SPLIT_EXACT) && eu_f16.ok(GEMM_TIGHT) && eu.ok(GEMM_TIER) && !eu.ok(GEMM_SPLIT_EXACT),
                   "gemm %-5s cfg B T=65 vs exact f32 operands: split (hi + lo) relL2 %.2e maxrel %.2e | single f16 plane "
                   "relL2 %.2e maxrel %.2e (tight vs f16 ref %.2e)",
                   FMT_NAME[fmt], es.rel_l2, es.max_rel(), eu.rel_l2, eu.max_rel(), eu_f16.rel_l2);
        }
        // Gathered rows.
        {
            const std::vector<int> rows = {69, 0, 31, 17, 40};
            int* dr = dev_alloc<int>(rows.size());
            memcpy(dr, rows.data(), rows.size() * 4);
            memset(y, 0xff, (size_t)TMAX * N * 4);
            emu_gemm(fmt, 2, 1, w, rb, x16, x16lo, K, dr, y, (int)rows.size(), N, K, LATE);
            Err et, ee;
            for (size_t i = 0; i < rows.size(); i++)
                for (int o = 0; o < N; o++) {
                    et.add(y[i * N + o], ref.tight[(size_t)rows[i] * N + o]);
                    ee.add(y[i * N + o], ref.exact[(size_t)rows[i] * N + o]);
                }
            et.finish();
            ee.finish();
            report(et.ok(GEMM_TIGHT) && ee.ok(exact_bound), "gemm %-5s cfg C gathered rows: tight relL2 %.2e nonfinite %lld, exact relL2 %.2e",
                   FMT_NAME[fmt], et.rel_l2, et.nonfinite, ee.rel_l2);
            dev_free(dr);
        }
        dev_free(w);
        dev_free(x);
        dev_free(x16);
        if (split) {
            dev_free(x16lo);
            dev_free(zero_lo);
        }
        dev_free(y);
    }
}

// ---------------------------------------------------------------- attention
static void attn_checks() {
    struct Case {
        int H, Hkv, T, pos0;
        pf_emu::CopyMode mode;
    };
    const Case cases[] = {{2, 1, 1, 0, LATE}, {2, 1, 65, 0, LATE}, {2, 1, 70, 37, EARLY}, {4, 2, 3, 130, LATE}};
    for (const Case& a : cases) {
        const int D = 256, kv_len = a.pos0 + a.T, ctx = kv_len + 3;
        Rng rng(a.T * 7 + a.pos0);
        std::vector<float> q((size_t)a.T * a.H * D), kc((size_t)ctx * a.Hkv * D), vc(kc.size());
        for (auto& v : q) v = (float)rng.normal();
        for (size_t i = 0; i < kc.size(); i++) {
            const bool live = i < (size_t)kv_len * a.Hkv * D;
            kc[i] = live ? (float)rng.normal() : NAN;
            vc[i] = live ? (float)rng.normal() : NAN;
        }
        float* dq = dev_alloc<float>(q.size());
        float* dk = dev_alloc<float>(kc.size());
        float* dv = dev_alloc<float>(vc.size());
        float* dout = dev_alloc<float>(q.size());
        __half* dk16 = dev_alloc<__half>(kc.size());
        __half* dv16 = dev_alloc<__half>(vc.size());
        memcpy(dq, q.data(), q.size() * 4);
        memcpy(dk, kc.data(), kc.size() * 4);
        memcpy(dv, vc.data(), vc.size() * 4);
        emu_f32_to_f16(dk, dk16, (long long)kc.size(), LATE);
        emu_f32_to_f16(dv, dv16, (long long)vc.size(), LATE);
        const float scale = 1.0f / 16;
        pf::FlashParams p{dq, dk16, dv16, dout, a.T, a.pos0, a.H, a.Hkv, scale * 1.4426950408889634f};
        pf_emu::launch(dim3((a.T + 63) / 64, a.H), dim3(pf::FA_NTH), pf::FA_SMEM, a.mode, [&] { pf_flash_attn_d256(p); });
        std::vector<int> ts;
        for (int t = 0; t < a.T; t++) ts.push_back(t);
        const std::vector<double> ref = attn_ref(q, kc, vc, a.H, a.Hkv, D, a.pos0, scale, ts);
        Err e;
        for (size_t i = 0; i < ref.size(); i++) e.add(dout[i], ref[i]);
        e.finish();
        report(e.ok(2e-3), "attn H=%d Hkv=%d T=%d pos0=%d: relL2 %.2e maxrel %.2e nonfinite %lld", a.H, a.Hkv, a.T, a.pos0,
               e.rel_l2, e.max_rel(), e.nonfinite);
        for (void* ptr : {(void*)dq, (void*)dk, (void*)dv, (void*)dout, (void*)dk16, (void*)dv16}) free(ptr);
    }
}

// ---------------------------------------------------------------- delta rule
static void delta_checks() {
    struct Case {
        int T, T1;
        double c;
        bool exact;
        pf_emu::CopyMode mode;
        uint64_t seed;
    };
    // The last case is the GPU harness's "exact T=200 c=20 (two calls)" with its seed (failed on
    // the H200 in run 1 at state relL2 3.3e-5 before gamma was carried as hi + lo).
    const Case cases[] = {{1, 1, 1, true, LATE, 501},      {65, 65, 20, true, LATE, 565},
                          {130, 70, 1, true, EARLY, 630},  {64, 64, 1, false, LATE, 564},
                          {100, 100, 1, true, EARLY, 600}, {200, 101, 20, true, LATE, 1620}};
    for (const Case& c : cases) {
        const GdnData d = gdn_make(2, 4, c.T, c.c, c.seed);
        const int D = 128, cd = 2 * d.hk * D + d.hv * D, nc = (c.T + 63) / 64;
        float* u = dev_alloc<float>(d.u.size());
        float* g = dev_alloc<float>(d.g.size());
        float* beta = dev_alloc<float>(d.beta.size());
        float* st = dev_alloc<float>(d.s0.size());
        float* out = dev_alloc<float>((size_t)c.T * d.hv * D);
        float* su = dev_alloc<float>((size_t)d.hv * nc * 64 * D);
        float* sw = dev_alloc<float>((size_t)d.hv * nc * 64 * D);
        float* sp = dev_alloc<float>((size_t)d.hv * nc * 64 * 64);
        float* sg = dev_alloc<float>((size_t)d.hv * nc * 128);  // gamma hi, lo
        memcpy(u, d.u.data(), d.u.size() * 4);
        memcpy(g, d.g.data(), d.g.size() * 4);
        memcpy(beta, d.beta.data(), d.beta.size() * 4);
        memcpy(st, d.s0.data(), d.s0.size() * 4);
        for (int part = 0; part < 2; part++) {
            const int t0 = part ? c.T1 : 0, T = part ? c.T - c.T1 : c.T1;
            if (T == 0) continue;
            pf::GdnParams p{u + (size_t)t0 * cd, g + (size_t)t0 * d.hv, beta + (size_t)t0 * d.hv, st,
                            out + (size_t)t0 * d.hv * D, su, sw, sp, sg, T, d.hk, d.hv};
            const int ncp = (T + 63) / 64;
            pf_emu::launch(dim3(ncp, d.hv), dim3(pf::GP_NTH), pf::GP_SMEM, c.mode,
                           [&] { (c.exact ? pf_gdn_prep_exact : pf_gdn_prep_fast)(p); });
            pf_emu::launch(dim3(128 / pf::GS_ROWS, d.hv), dim3(pf::GS_NTH), pf::GS_SMEM, c.mode,
                           [&] { (c.exact ? pf_gdn_state_exact : pf_gdn_state_fast)(p); });
        }
        std::vector<double> s(d.s0.begin(), d.s0.end()), ro((size_t)c.T * d.hv * D);
        gdn_ref(d, s, 0, c.T, ro);
        Err eo, es;
        for (size_t i = 0; i < ro.size(); i++) eo.add(out[i], ro[i]);
        for (size_t i = 0; i < s.size(); i++) es.add(st[i], s[i]);
        eo.finish();
        es.finish();
        const double bound = c.exact ? 2e-5 : 6e-3;
        report(eo.ok(bound) && es.ok(bound), "delta %s T=%d (calls at 0, %d) c=%g: out relL2 %.2e nonfinite %lld, state relL2 %.2e",
               c.exact ? "exact" : "fast ", c.T, c.T1, c.c, eo.rel_l2, eo.nonfinite, es.rel_l2);
        for (float* ptr : {u, g, beta, st, out, su, sw, sp, sg}) free(ptr);
    }
}

// ---------------------------------------------------------------- MoE
// The grouped pipeline with gate/up experts of format fmt_gu and down experts of fmt_d. Split
// formats read lo planes: x's gathered through slot_token like its hi plane, h's written by
// pf_swiglu_f16. For them the pipeline also runs with zeroed lo planes (the single-plane product)
// to show what the split buys.
static void moe_check(int fmt_gu, int fmt_d) {
    const int T = 40, k = 2, E = 8, d = 256, nff = 256;
    const int cfg = 2, bm = 32;
    const bool split_gu = split_fmt(fmt_gu), split_d = split_fmt(fmt_d);
    Rng rng(3);
    const int S = T * k;
    std::vector<uint32_t> ids(S);
    std::vector<float> wts(S);
    for (int t = 0; t < T; t++) {
        const int a = (int)(rng.uni() * E), b = (a + 1 + (int)(rng.uni() * (E - 1))) % E;
        ids[t * k] = a;
        ids[t * k + 1] = b;
        wts[t * k] = (float)rng.uni();
        wts[t * k + 1] = 1.0f - wts[t * k];
    }
    const std::vector<uint8_t> wg = make_weights(fmt_gu, (long long)E * nff, d, 1), wu = make_weights(fmt_gu, (long long)E * nff, d, 2),
                               wd = make_weights(fmt_d, (long long)E * d, nff, 3);
    const long long rbg = row_bytes(fmt_gu, d), rbd = row_bytes(fmt_d, nff);
    uint8_t* dwg = dev_alloc<uint8_t>(wg.size());
    uint8_t* dwu = dev_alloc<uint8_t>(wu.size());
    uint8_t* dwd = dev_alloc<uint8_t>(wd.size());
    memcpy(dwg, wg.data(), wg.size());
    memcpy(dwu, wu.data(), wu.size());
    memcpy(dwd, wd.data(), wd.size());
    std::vector<float> xf((size_t)T * d);
    for (auto& v : xf) v = (float)(rng.uni() * 2 - 1);
    float* dx = dev_alloc<float>(xf.size());
    memcpy(dx, xf.data(), xf.size() * 4);
    __half* x16 = dev_alloc<__half>(xf.size());
    __half* x16lo = dev_alloc<__half>(xf.size());
    emu_f32_to_f16(dx, x16, (long long)xf.size(), LATE, x16lo);
    __half* zeros = dev_alloc<__half>((size_t)S * std::max(d, nff));
    memset(zeros, 0, (size_t)S * std::max(d, nff) * 2);
    uint32_t* dids = dev_alloc<uint32_t>(S);
    float* dw = dev_alloc<float>(S);
    memcpy(dids, ids.data(), S * 4);
    memcpy(dw, wts.data(), S * 4);
    int* counts = dev_alloc<int>(E);
    int* offsets = dev_alloc<int>(E + 1);
    int* ntiles = dev_alloc<int>(1);
    int* slot_token = dev_alloc<int>(S);
    int* slot_of = dev_alloc<int>(S);
    const int max_tiles = (S + bm - 1) / bm + E;
    int4* tiles = dev_alloc<int4>(max_tiles);
    float* G = dev_alloc<float>((size_t)S * nff);
    float* U = dev_alloc<float>((size_t)S * nff);
    float* Dy = dev_alloc<float>((size_t)S * d);
    __half* H = dev_alloc<__half>((size_t)S * nff);
    __half* Hlo = dev_alloc<__half>((size_t)S * nff);
    float* out = dev_alloc<float>((size_t)T * d);
    memset(counts, 0, E * 4);
    const pf::MoeParams mp{dids, counts, offsets, tiles, ntiles, slot_token, slot_of, Dy, dw, out, S, E, k, bm, d};
    pf_emu::launch(dim3((S + 255) / 256), dim3(256), 0, LATE, [&] { pf_moe_count(mp); });
    pf_emu::launch(dim3(1), dim3(1024), 0, LATE, [&] { pf_moe_offsets(mp); });
    pf_emu::launch(dim3(E), dim3(256), 0, LATE, [&] { pf_moe_place(mp); });
    auto grouped = [&](int fmt, const uint8_t* w, long long rb, long long eb, const __half* x, const __half* xlo, long long ldx,
                       const int* xr, float* y, int n, int kdim) {
        const pf::GemmParams p = grouped_params(w, rb, eb, x, split_fmt(fmt) ? xlo : nullptr, ldx, xr, y, n, kdim, tiles, ntiles);
        pf_emu::launch(dim3((n + CFG[cfg].bn - 1) / CFG[cfg].bn, max_tiles), dim3(CFG[cfg].nth), SMEM[fmt][cfg], LATE,
                       [&] { KERN[fmt][cfg](p); });
    };
    // Gate, up, SwiGLU, down, combine; `with_lo` false: zero lo planes (single-plane products).
    auto forward = [&](bool with_lo) {
        grouped(fmt_gu, dwg, rbg, nff * rbg, x16, with_lo ? x16lo : zeros, d, slot_token, G, nff, d);
        grouped(fmt_gu, dwu, rbg, nff * rbg, x16, with_lo ? x16lo : zeros, d, slot_token, U, nff, d);
        __half* hlo = split_d && with_lo ? Hlo : nullptr;
        pf_emu::launch(dim3(4), dim3(256), 0, LATE, [&] { pf_swiglu_f16(pf::SwigluParams{G, U, H, hlo, nullptr, (long long)S * nff}); });
        grouped(fmt_d, dwd, rbd, d * rbd, H, with_lo ? Hlo : zeros, nff, nullptr, Dy, d, nff);
        pf_emu::launch(dim3(T), dim3(256), 0, LATE, [&] { pf_moe_combine(mp); });
    };
    forward(true);

    bool group_ok = offsets[0] == 0 && offsets[E] == S;
    std::vector<int> seen(S, 0);
    for (int i = 0; i < S && group_ok; i++) {
        const int sl = slot_of[i], e = ids[i];
        group_ok = sl >= offsets[e] && sl < offsets[e + 1] && slot_token[sl] == i / k && !seen[sl]++;
    }
    for (int e = 0; e < E && group_ok; e++)
        for (int sl = offsets[e] + 1; sl < offsets[e + 1]; sl++) group_ok &= slot_token[sl - 1] < slot_token[sl];
    std::vector<int> ts;
    for (int t = 0; t < T; t++) ts.push_back(t);
    std::vector<double> rt, re;
    moe_ref(fmt_gu, fmt_d, wg.data(), wu.data(), wd.data(), rbg, rbd, xf, ids, wts, k, d, nff, ts, rt, re);
    Err et, ee;
    for (size_t i = 0; i < rt.size(); i++) {
        et.add(out[i], rt[i]);
        ee.add(out[i], re[i]);
    }
    et.finish();
    ee.finish();
    // All-split experts are f32-class end to end (2e-5); otherwise the f16 tier (6e-3).
    const bool all_split = split_gu && split_d;
    const double exact_bound = all_split ? 2e-5 : 6e-3, tight_bound = all_split ? 1e-5 : 5e-4;
    report(group_ok && et.ok(tight_bound) && ee.ok(exact_bound),
           "moe %s/%s T=%d E=%d k=%d: grouping %s, %d tiles, tight relL2 %.2e nonfinite %lld, exact relL2 %.2e (bound %.0e)",
           FMT_NAME[fmt_gu], FMT_NAME[fmt_d], T, E, k, group_ok ? "consistent" : "BROKEN", *ntiles, et.rel_l2, et.nonfinite,
           ee.rel_l2, exact_bound);
    if (all_split) {
        forward(false);
        Err eu;
        for (size_t i = 0; i < re.size(); i++) eu.add(out[i], re[i]);
        eu.finish();
        report(eu.ok(6e-3) && !eu.ok(exact_bound),
               "moe %s/%s vs exact: split (hi + lo) relL2 %.2e | single f16 plane relL2 %.2e", FMT_NAME[fmt_gu],
               FMT_NAME[fmt_d], ee.rel_l2, eu.rel_l2);
    }
    for (void* ptr : {(void*)dwg, (void*)dwu, (void*)dwd, (void*)dx, (void*)x16, (void*)x16lo, (void*)zeros, (void*)dids,
                      (void*)dw, (void*)counts, (void*)offsets, (void*)ntiles, (void*)slot_token, (void*)slot_of,
                      (void*)tiles, (void*)G, (void*)U, (void*)Dy, (void*)H, (void*)Hlo, (void*)out})
        free(ptr);
}

static void moe_checks() {
    moe_check(Q4K, Q6K);
    moe_check(F16, F16);  // tiny-moe.F16's experts: the lo planes gathered and written
}

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "all";
    const bool all = what == "all";
    if (all || what == "deq") {
        deq_check<pf::FMT_Q4K>(Q4K);
        deq_check<pf::FMT_Q5K>(Q5K);
        deq_check<pf::FMT_Q6K>(Q6K);
        deq_check<pf::FMT_Q80>(Q80);
        deq_check<pf::FMT_F16>(F16);
        deq_check<pf::FMT_BF16>(BF16);
    }
    if (all || what == "gemm") gemm_checks();
    if (all || what == "attn") attn_checks();
    if (all || what == "delta") delta_checks();
    if (all || what == "moe") moe_checks();
    printf("%s: %d failed (%lld async copies, %lld warp collectives emulated)\n", g_fail ? "FAILURES" : "all pass", g_fail,
           pf_emu::g.copies, pf_emu::g.collectives);
    return g_fail ? 1 : 0;
}
