// emulate.cpp: every CUDA kernel of kernels-cuda/ run on the CPU (dev/cuda/host_shim.h with
// RILL_EMULATE_THREADS: one OS thread per CUDA thread, real barriers and warp shuffles) with the
// launch geometry the Rust backend uses, against plain double-precision references. It catches
// indexing, reduction and synchronisation mistakes before any GPU time is spent; the numbers are
// then checked again on the GPU by the Rust test suite. Run through dev/cuda/emulate.sh.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "attention.cu"
#include "conv.cu"
#include "delta_rule.cu"
#include "elementwise.cu"
#include "embed.cu"
#include "gdn_step.cu"
#include "matmul_tiled.cu"
#include "matvec.cu"
#include "matvec_glu.cu"
#include "matvec_sh.cu"
#include "moe.cu"
#include "norm.cu"
#include "rows.cu"

static int failures = 0, checks = 0;

// |got - want| <= atol + rtol * scale per element; prints the worst.
static void expect(const std::string& what, const std::vector<float>& got, const std::vector<double>& want, double atol,
                   double rtol, const std::vector<double>* scale = nullptr) {
    checks++;
    double worst = 0;
    size_t wi = 0;
    bool bad = got.size() != want.size();
    for (size_t i = 0; !bad && i < got.size(); ++i) {
        const double s = scale ? (*scale)[i] : std::fabs(want[i]);
        const double ex = std::fabs(got[i] - want[i]) - (atol + rtol * s);
        if (std::isnan(got[i]) || ex > worst) {
            worst = std::isnan(got[i]) ? INFINITY : ex;
            wi = i;
        }
    }
    if (bad || worst > 0) {
        failures++;
        if (bad)
            printf("FAIL %s: %zu values, want %zu\n", what.c_str(), got.size(), want.size());
        else
            printf("FAIL %s [%zu]: got %.9g want %.9g\n", what.c_str(), wi, got[wi], want[wi]);
    }
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd() {
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * 0x2545F4914F6CDD1Dull;
}
static float urand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)); }
static float nrand() { return (urand() + urand() + urand() - 1.5f) * 2.0f; }
static std::vector<float> normals(size_t n, float s = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = nrand() * s;
    return v;
}
static uint16_t f2h(float f) {
    // round to nearest even f32 -> f16 for normal values (the test data is normal)
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t m = u & 0x7fffff;
    if (e <= 0) return (uint16_t)sign;
    uint32_t h = sign | (e << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

// Device memory stand-in: a zero-padded, 256-byte aligned copy.
struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    Buf() = default;
    explicit Buf(size_t bytes) : n(bytes) {
        const size_t pad = (bytes + 64 + 255) / 256 * 256;
        p = static_cast<uint8_t*>(aligned_alloc(256, pad));
        memset(p, 0, pad);
    }
    template <class T>
    static Buf of(const std::vector<T>& v) {
        Buf b(v.size() * sizeof(T));
        memcpy(b.p, v.data(), b.n);
        return b;
    }
    template <class T>
    std::vector<T> get(size_t count) const {
        std::vector<T> v(count);
        memcpy(v.data(), p, count * sizeof(T));
        return v;
    }
    unsigned long long addr() const { return (unsigned long long)p; }
};

// ---------------------------------------------------------------------------------------------
// Weights: random blocks with sane scales, and their dequantized values (formats.cuh decoders are
// bit-identical to ggml, dev/cuda/check_formats.sh).

struct FmtDesc {
    const char* name;
    int qk, bytes;
};

template <class F>
static size_t row_bytes_of(int cols) {
    return F::FLOAT ? (size_t)cols * (F::BYTES / 32) : (size_t)(cols / F::QK) * F::BYTES;
}

template <class F>
static std::vector<uint8_t> random_weight(int rows, int cols) {
    const size_t rb = row_bytes_of<F>(cols);
    std::vector<uint8_t> w(rb * rows);
    if constexpr (F::FLOAT) {
        for (size_t i = 0; i < (size_t)rows * cols; ++i) {
            const float v = nrand();
            if (F::BYTES == 128) {
                memcpy(w.data() + 4 * i, &v, 4);
            } else {
                const uint16_t h = f2h(v);
                memcpy(w.data() + 2 * i, &h, 2);
            }
        }
        return w;
    }
    for (auto& b : w) b = (uint8_t)rnd();
    // Small normal f16 scales where the formats keep them.
    const size_t nb = w.size() / F::BYTES;
    for (size_t i = 0; i < nb; ++i) {
        uint8_t* b = w.data() + i * F::BYTES;
        auto put = [&](int off) {
            const uint16_t h = f2h((0.002f + 0.006f * urand()) * (rnd() & 1 ? 1 : -1));
            memcpy(b + off, &h, 2);
        };
        if (F::QK == 32) {
            put(0);
            if (F::BYTES == 20 || F::BYTES == 24) put(2);
        } else if (F::BYTES == 144 || F::BYTES == 176) {
            put(0);
            put(2);
        } else if (F::BYTES == 210) {
            put(208);
        }
    }
    return w;
}

template <class F>
static std::vector<double> dequant(const std::vector<uint8_t>& w, int rows, int cols) {
    const size_t rb = w.size() / rows;
    Buf b = Buf::of(w);
    std::vector<double> out((size_t)rows * cols);
    for (int r = 0; r < rows; ++r)
        for (int k = 0; k < (cols + 31) / 32; ++k) {
            float y[32];
            dec_unit<F>(b.p + r * rb, k, cols, y);
            for (int i = 0; i < 32 && 32 * k + i < cols; ++i) out[(size_t)r * cols + 32 * k + i] = y[i];
        }
    return out;
}

// The Rust plan (src/backend/cuda/ops/linear.rs): unit lanes; rows per thread chosen by the test.
static int unit_lanes(int units) {
    for (int ut : {256, 128, 64, 32})
        if (units >= ut && units % ut == 0) return ut;
    if (units < 256) {
        int p = 32;
        while (p < units) p *= 2;
        return p;
    }
    return 256;
}

struct Mv {
    unsigned long long w, w2 = 0, x, out, ids = 0, scales = 0;
    int n_out, n_in;
    size_t row_bytes, expert_bytes = 0;
    int n_experts = 1, x_group = 1, nsum = 1, vectors = 1, rpt = 1;
    bool x_in_smem = true;
    // The shared expert of the `_sh_` kernels: its W (p7), its W2 or gate logits (p3).
    unsigned long long sh = 0, sh2 = 0;
};

// The segment table of a matvec launch (common.cuh `MvSeg`) as the Rust backend fills it
// (ops/linear.rs `Mv::chunks`): the products (weights, output, rows) one after another, each
// rounded up to whole blocks of rpb rows. Returns the grid's x blocks.
struct Prod {
    unsigned long long w, out;
    int rows;
};
static unsigned set_segs(Args& a, const std::vector<Prod>& ps, int rpb) {
    int b = 0;
    for (size_t s = 0; s < ps.size(); ++s) {
        a.seg[s] = MvSeg{ps[s].w, ps[s].out, ps[s].rows, b};
        b += (ps[s].rows + rpb - 1) / rpb;
    }
    return (unsigned)b;
}

static void run_mv(void (*k)(const Args), const Mv& m) {
    const int units = (m.n_in + 31) / 32, ut = unit_lanes(units), rpb = (256 / ut) * m.rpt;
    Args a;
    memset(&a, 0, sizeof a);
    const unsigned gx = set_segs(a, {{m.w, m.out, m.n_out}}, rpb);
    a.p[1] = m.w2;
    a.p[2] = m.x;
    a.p[4] = m.ids;
    a.p[5] = m.scales;
    a.p[3] = m.sh2;
    a.p[7] = m.sh;
    a.n[1] = m.n_in;
    a.n[2] = (long long)m.row_bytes;
    a.n[3] = (long long)m.expert_bytes;
    a.n[4] = m.n_experts;
    a.n[5] = m.x_group;
    a.n[6] = m.nsum;
    a.n[7] = ut;
    a.n[8] = m.rpt;
    a.n[9] = m.x_in_smem;
    a.n[11] = m.n_in;
    const size_t smem = m.x_in_smem ? (size_t)m.nsum * units * MV_XPAD * 4 : 0;
    emu_launch(k, Dim3{gx, (unsigned)m.vectors, 1}, 256, smem, a);
}

static double silu(double v) { return v / (1 + std::exp(-v)); }

template <class F>
static void test_matvec(const char* name, void (*kmv)(const Args), void (*kglu)(const Args), void (*ktiled)(const Args),
                        void (*kembed)(const Args), int n_in) {
    for (int n_out : {1, 7, 37}) {
        auto wb = random_weight<F>(n_out, n_in);
        auto wd = dequant<F>(wb, n_out, n_in);
        const size_t rb = wb.size() / n_out;
        Buf W = Buf::of(wb);
        for (int T : {1, 3, 5, 65}) {
            auto x = normals((size_t)T * n_in);
            Buf X = Buf::of(x), O(sizeof(float) * T * n_out);
            std::vector<double> want((size_t)T * n_out), mag((size_t)T * n_out);
            for (int t = 0; t < T; ++t)
                for (int o = 0; o < n_out; ++o) {
                    double s = 0, m = 0;
                    for (int i = 0; i < n_in; ++i) {
                        s += wd[(size_t)o * n_in + i] * x[(size_t)t * n_in + i];
                        m += std::fabs(wd[(size_t)o * n_in + i] * x[(size_t)t * n_in + i]);
                    }
                    want[(size_t)t * n_out + o] = s;
                    mag[(size_t)t * n_out + o] = m;
                }
            const std::string what = std::string(name) + " [" + std::to_string(n_out) + "x" + std::to_string(n_in) +
                                     "] T " + std::to_string(T);
            if (T <= 3) {
                for (int rpt : {1, 3, 8})
                    for (bool xs : {true, false}) {
                        memset(O.p, 0xFF, O.n);
                        run_mv(kmv, Mv{W.addr(), 0, X.addr(), O.addr(), 0, 0, n_out, n_in, rb, 0, 1, 1, 1, T, rpt, xs});
                        expect("matvec " + what + " rpt " + std::to_string(rpt) + (xs ? "" : " x-global"),
                               O.get<float>((size_t)T * n_out), want, 1e-30, 1e-5, &mag);
                    }
            } else {
                memset(O.p, 0xFF, O.n);
                Args a;
                memset(&a, 0, sizeof a);
                a.p[0] = W.addr();
                a.p[1] = X.addr();
                a.p[2] = O.addr();
                a.n[0] = n_out;
                a.n[1] = n_in;
                a.n[2] = (long long)rb;
                a.n[3] = T;
                emu_launch(ktiled, Dim3{(unsigned)((n_out + 63) / 64), (unsigned)((T + 63) / 64), 1}, 256, 0, a);
                expect("matmul_tiled " + what, O.get<float>((size_t)T * n_out), want, 1e-30, 1e-5, &mag);
            }
        }
        // Fused SwiGLU: the same weight as gate and (a second random one as) up.
        auto ub = random_weight<F>(n_out, n_in);
        auto ud = dequant<F>(ub, n_out, n_in);
        Buf U = Buf::of(ub);
        for (int T : {1, 3}) {
            auto x = normals((size_t)T * n_in);
            Buf X = Buf::of(x), O(sizeof(float) * T * n_out);
            std::vector<double> want((size_t)T * n_out), mag((size_t)T * n_out);
            for (int t = 0; t < T; ++t)
                for (int o = 0; o < n_out; ++o) {
                    double g = 0, u = 0, mg = 0, mu = 0;
                    for (int i = 0; i < n_in; ++i) {
                        const double xi = x[(size_t)t * n_in + i];
                        g += wd[(size_t)o * n_in + i] * xi;
                        u += ud[(size_t)o * n_in + i] * xi;
                        mg += std::fabs(wd[(size_t)o * n_in + i] * xi);
                        mu += std::fabs(ud[(size_t)o * n_in + i] * xi);
                    }
                    want[(size_t)t * n_out + o] = silu(g) * u;
                    mag[(size_t)t * n_out + o] = mg * std::fabs(u) + mu * std::fabs(silu(g)) + 1e-30;
                }
            for (int rpt : {1, 4}) {
                run_mv(kglu, Mv{W.addr(), U.addr(), X.addr(), O.addr(), 0, 0, n_out, n_in, rb, 0, 1, 1, 1, T, rpt, true});
                expect(std::string("matvec_glu ") + name + " n_out " + std::to_string(n_out) + " T " + std::to_string(T) +
                           " rpt " + std::to_string(rpt),
                       O.get<float>((size_t)T * n_out), want, 1e-30, 1e-5, &mag);
            }
        }
        // Embedding rows (ids past the table give zeros).
        std::vector<uint32_t> ids = {0, (uint32_t)(n_out - 1), 0xFFFFFFFFu, (uint32_t)(n_out / 2)};
        Buf I = Buf::of(ids), O(sizeof(float) * ids.size() * n_in);
        Args a;
        memset(&a, 0, sizeof a);
        a.p[0] = W.addr();
        a.p[1] = I.addr();
        a.p[2] = O.addr();
        a.n[0] = n_out;
        a.n[1] = n_in;
        a.n[2] = (long long)rb;
        const int units = (n_in + 31) / 32;
        emu_launch(kembed, Dim3{(unsigned)((units + 63) / 64), (unsigned)ids.size(), 1}, 64, 0, a);
        std::vector<double> want(ids.size() * n_in, 0.0);
        for (size_t t = 0; t < ids.size(); ++t)
            if (ids[t] < (uint32_t)n_out)
                for (int i = 0; i < n_in; ++i) want[t * n_in + i] = wd[(size_t)ids[t] * n_in + i];
        expect(std::string("embed ") + name + " n_out " + std::to_string(n_out), O.get<float>(ids.size() * n_in), want, 0, 0);
    }
}

// One MoE layer's worth of random experts (E = 6, k = 3, T = 3 tokens; one invalid expert id) and
// its buffers, for the MoE kernels.
template <class F>
struct MoeCase {
    static constexpr int E = 6, k = 3, T = 3;
    std::vector<uint8_t> gb, ub, db;
    std::vector<double> gd, udq, dd;
    size_t rbg, rbd;
    std::vector<uint32_t> ids = {0, 5, 2, 3, 3, 1, 4, 0, 9 /* invalid: contributes nothing */};
    std::vector<float> ws = {0.5f, 0.3f, 0.2f, 0.6f, 0.1f, 0.3f, 0.7f, 0.2f, 0.1f};
    std::vector<float> x;
    Buf G, U, D, I, S, X, H, O;
    MoeCase(int d, int f)
        : gb(random_weight<F>(E * f, d)), ub(random_weight<F>(E * f, d)), db(random_weight<F>(E * d, f)),
          gd(dequant<F>(gb, E * f, d)), udq(dequant<F>(ub, E * f, d)), dd(dequant<F>(db, E * d, f)),
          rbg(gb.size() / (E * f)), rbd(db.size() / (E * d)), x(normals((size_t)T * d)), G(Buf::of(gb)), U(Buf::of(ub)),
          D(Buf::of(db)), I(Buf::of(ids)), S(Buf::of(ws)), X(Buf::of(x)), H(sizeof(float) * T * k * f),
          O(sizeof(float) * T * d) {}
};

// MoE: gate/up products with expert ids (x_group = k), then the k-way weighted down sum.
template <class F>
static void test_moe(const char* name, void (*kglu)(const Args), void (*kmv)(const Args), int d, int f) {
    MoeCase<F> c(d, f);
    const int E = c.E, k = c.k, T = c.T;
    const auto &gd = c.gd, &udq = c.udq, &dd = c.dd;
    const auto &ids = c.ids;
    const auto &ws = c.ws;
    const auto &x = c.x;
    const size_t rbg = c.rbg, rbd = c.rbd;
    Buf &G = c.G, &U = c.U, &D = c.D, &I = c.I, &S = c.S, &X = c.X, &H = c.H, &O = c.O;
    memset(H.p, 0, H.n);
    run_mv(kglu, Mv{G.addr(), U.addr(), X.addr(), H.addr(), I.addr(), 0, f, d, rbg, f * rbg, E, k, 1, T * k, 2, true});
    std::vector<double> hw((size_t)T * k * f, 0.0);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j) {
            const uint32_t e = ids[t * k + j];
            if (e >= (uint32_t)E) continue;
            for (int o = 0; o < f; ++o) {
                double g = 0, u = 0;
                for (int i = 0; i < d; ++i) {
                    g += gd[((size_t)e * f + o) * d + i] * x[(size_t)t * d + i];
                    u += udq[((size_t)e * f + o) * d + i] * x[(size_t)t * d + i];
                }
                hw[((size_t)t * k + j) * f + o] = silu(g) * u;
            }
        }
    auto h = H.get<float>((size_t)T * k * f);
    expect(std::string("moe gate/up ") + name, h, hw, 1e-4, 1e-4);
    run_mv(kmv, Mv{D.addr(), 0, H.addr(), O.addr(), I.addr(), S.addr(), d, f, rbd, d * rbd, E, 1, k, T, 2, true});
    // The bound scales with sum |terms| (f32 sums of 2 k f products of hidden rows that can reach
    // 1e3: with cancellation a row of ~1 sums terms of ~2e5, where f32 alone is 1e-8 of that; a
    // bound relative to the result failed there, one random draw in the full run): 2e-6 of the
    // magnitude, tighter than the former 1e-4 where nothing cancels.
    std::vector<double> ow((size_t)T * d, 0.0), omag((size_t)T * d, 0.0);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j) {
            const uint32_t e = ids[t * k + j];
            if (e >= (uint32_t)E) continue;
            for (int o = 0; o < d; ++o) {
                double s = 0, m = 0;
                for (int i = 0; i < f; ++i) {
                    const double p = dd[((size_t)e * d + o) * f + i] * h[((size_t)t * k + j) * f + i];
                    s += p;
                    m += std::fabs(p);
                }
                ow[(size_t)t * d + o] += ws[t * k + j] * s;
                omag[(size_t)t * d + o] += ws[t * k + j] * m;
            }
        }
    expect(std::string("moe down ") + name, O.get<float>((size_t)T * d), ow, 1e-30, 2e-6, &omag);
}

// A MoE layer's shared expert run as expert k of each token's k + 1 (the `_sh_` kernels,
// common.cuh MvShared) against the composition the backend runs without them: the routed experts
// (the MoE kernels), the shared expert's SwiGLU and down products (the dense kernels) and
// out += sigmoid(gate logit) * shared. The gate/up rows are the same arithmetic, so bit for bit;
// the down sums add the shared term inside the sum (other rounding): within the matvec bound of
// the composition, and of the double-precision reference.
template <class F>
static void test_moe_shared(const char* name, void (*kglu)(const Args), void (*kmv)(const Args),
                            void (*kglu_sh)(const Args), void (*kmv_sh)(const Args), int d, int f) {
    MoeCase<F> c(d, f);
    const int E = c.E, k = c.k, T = c.T;
    const std::string what = std::string("moe shared ") + name;
    auto gsb = random_weight<F>(f, d), usb = random_weight<F>(f, d), dsb = random_weight<F>(d, f);
    auto dsd = dequant<F>(dsb, d, f);
    // Gate logits: sigmoid near 0, near 1 and in between.
    const std::vector<float> sg = {-30.0f, 0.7f, 12.0f};
    Buf GS = Buf::of(gsb), US = Buf::of(usb), DS = Buf::of(dsb), SG = Buf::of(sg);
    Buf Hr(sizeof(float) * T * k * f), Hs(sizeof(float) * T * f), Hf(sizeof(float) * T * (k + 1) * f);
    Buf Or(sizeof(float) * T * d), Os(sizeof(float) * T * d), Of(sizeof(float) * T * d);
    auto launch = [&](void (*kern)(const Args), Mv m) { run_mv(kern, m); };
    for (bool xs : {true, false}) {
        const std::string w = what + (xs ? "" : " x-global");
        // The composition.
        const size_t rbg = c.rbg, rbd = c.rbd, rbs = gsb.size() / f, rbds = dsb.size() / d;
        launch(kglu, Mv{c.G.addr(), c.U.addr(), c.X.addr(), Hr.addr(), c.I.addr(), 0, f, d, rbg, f * rbg, E, k, 1, T * k, 2, xs});
        launch(kglu, Mv{GS.addr(), US.addr(), c.X.addr(), Hs.addr(), 0, 0, f, d, rbs, 0, 1, 1, 1, T, 3, xs});
        launch(kmv, Mv{c.D.addr(), 0, Hr.addr(), Or.addr(), c.I.addr(), c.S.addr(), d, f, rbd, d * rbd, E, 1, k, T, 2, xs});
        launch(kmv, Mv{DS.addr(), 0, Hs.addr(), Os.addr(), 0, 0, d, f, rbds, 0, 1, 1, 1, T, 1, xs});
        // Fused: k + 1 entries per token.
        memset(Hf.p, 0xFF, Hf.n);
        Mv gu{c.G.addr(), c.U.addr(), c.X.addr(), Hf.addr(), c.I.addr(), 0, f, d, rbg, f * rbg, E, k + 1, 1, T * (k + 1), 1, xs};
        gu.sh = GS.addr(), gu.sh2 = US.addr();
        launch(kglu_sh, gu);
        const auto hr = Hr.get<float>((size_t)T * k * f), hs = Hs.get<float>((size_t)T * f);
        const auto hf = Hf.get<float>((size_t)T * (k + 1) * f);
        int differ = 0;
        for (int t = 0; t < T; ++t)
            for (int j = 0; j <= k; ++j)
                for (int o = 0; o < f; ++o) {
                    const float want = j < k ? hr[((size_t)t * k + j) * f + o] : hs[(size_t)t * f + o];
                    differ += memcmp(&hf[((size_t)t * (k + 1) + j) * f + o], &want, 4) != 0;
                }
        checks++;
        if (differ) {
            failures++;
            printf("FAIL %s gate/up: %d of %d hidden values differ from the composition's\n", w.c_str(), differ,
                   T * (k + 1) * f);
        }
        memset(Of.p, 0xFF, Of.n);
        Mv dn{c.D.addr(), 0, Hf.addr(), Of.addr(), c.I.addr(), c.S.addr(), d, f, rbd, d * rbd, E, 1, k + 1, T, 3, xs};
        dn.sh = DS.addr(), dn.sh2 = SG.addr();
        launch(kmv_sh, dn);
        // The composition's sum (sigmoid_scale_add), the f64 reference on the device's hidden rows and
        // the magnitude of the terms.
        const auto orr = Or.get<float>((size_t)T * d), os = Os.get<float>((size_t)T * d);
        std::vector<double> comp((size_t)T * d), ref((size_t)T * d, 0.0), mag((size_t)T * d, 1e-30);
        for (int t = 0; t < T; ++t) {
            const double sig = 1.0 / (1.0 + std::exp(-(double)sg[t]));
            for (int o = 0; o < d; ++o) {
                const size_t i = (size_t)t * d + o;
                comp[i] = (double)(orr[i] + (float)(1.0f / (1.0f + std::exp(-sg[t]))) * os[i]);
                for (int j = 0; j <= k; ++j) {
                    const uint32_t e = j < k ? c.ids[t * k + j] : 0;
                    if (j < k && e >= (uint32_t)E) continue;
                    const double wj = j < k ? c.ws[t * k + j] : sig;
                    const double* row = j < k ? &c.dd[((size_t)e * d + o) * f] : &dsd[(size_t)o * f];
                    double s = 0, m = 0;
                    for (int i2 = 0; i2 < f; ++i2) {
                        const double p = row[i2] * hf[((size_t)t * (k + 1) + j) * f + i2];
                        s += p;
                        m += std::fabs(p);
                    }
                    ref[i] += wj * s;
                    mag[i] += std::fabs(wj) * m;
                }
            }
        }
        const auto of = Of.get<float>((size_t)T * d);
        expect(w + " down vs composition", of, comp, 1e-30, 1e-5, &mag);
        expect(w + " down vs f64", of, ref, 1e-30, 1e-5, &mag);
    }
}

// ---------------------------------------------------------------------------------------------

// Grouped launches (Backend::matmul_group; the segment table of common.cuh): several products of
// one x in one grid, with row counts that are not a multiple of a block's rows and T vectors. Each
// product's output must be bit for bit what it gives launched alone with the same UT and another
// RPT (ops/linear.rs plans a product's rows per thread from its rows alone, a group's from all
// of them: the rows a thread takes must not change a row's sum), and
// nothing may be written outside the outputs (they lie in one buffer with NaN-filled gaps). For
// the f32 kernel `kmv`, filled as ops/linear.rs `run_mv` fills a dense product.
template <class F>
static void test_matvec_group(const char* name, void (*kmv)(const Args), int n_in,
                              const std::vector<int>& rows) {
    const int n = (int)rows.size(), units = (n_in + 31) / 32, gap = 16;
    std::vector<Buf> W;
    for (int r : rows) W.push_back(Buf::of(random_weight<F>(r, n_in)));
    const size_t rb = W[0].n / rows[0];
    for (int T : {1, 3}) {
        auto x = normals((size_t)T * n_in);
        Buf X = Buf::of(x);
        // Output i at off[i] floats of one buffer, gap floats before each and after the last.
        std::vector<size_t> off(n);
        size_t total = gap;
        for (int i = 0; i < n; ++i) {
            off[i] = total;
            total += (size_t)T * rows[i] + gap;
        }
        Buf Alone(4 * total), Grouped(4 * total);
        auto out = [&](const Buf& b, int i) { return b.addr() + 4 * off[i]; };
        {
            const int ut = unit_lanes(units);
            for (int rpt : {1, 3}) {
                auto launch = [&](const std::vector<Prod>& ps, int rpt) {
                    Args a;
                    memset(&a, 0, sizeof a);
                    const unsigned gx = set_segs(a, ps, (256 / ut) * rpt);
                    a.p[2] = X.addr();
                    a.n[1] = n_in;
                    a.n[2] = (long long)rb;
                    a.n[4] = 1;
                    a.n[5] = 1;
                    a.n[6] = 1;
                    a.n[7] = ut;
                    a.n[8] = rpt;
                    a.n[9] = 1;
                    a.n[11] = n_in;
                    const size_t smem = (size_t)units * MV_XPAD * 4;
                    emu_launch(kmv, Dim3{gx, (unsigned)T, 1}, 256, smem, a);
                };
                memset(Alone.p, 0xFF, Alone.n);
                memset(Grouped.p, 0xFF, Grouped.n);
                std::vector<Prod> all;
                for (int i = 0; i < n; ++i) {
                    launch({{W[i].addr(), out(Alone, i), rows[i]}}, 4 - rpt);  // 3 or 1
                    all.push_back({W[i].addr(), out(Grouped, i), rows[i]});
                }
                launch(all, rpt);
                checks++;
                // Bit for bit, gaps included (both all 0xFF there).
                const bool same = memcmp(Alone.p, Grouped.p, 4 * total) == 0;
                bool gaps = true;
                for (int i = 0; i <= n; ++i) {
                    const size_t g0 = i == 0 ? 0 : off[i - 1] + (size_t)T * rows[i - 1];
                    for (size_t j = 0; j < 4 * (size_t)gap; ++j) gaps &= Grouped.p[4 * g0 + j] == 0xFF && Alone.p[4 * g0 + j] == 0xFF;
                }
                std::string what = std::string("matvec ") + name + " group";
                for (int r : rows) what += " " + std::to_string(r);
                what += " x " + std::to_string(n_in) + " T " + std::to_string(T) + " rpt " + std::to_string(rpt);
                if (!same || !gaps) {
                    failures++;
                    printf("FAIL %s: %s\n", what.c_str(), !gaps ? "wrote outside its outputs" : "differs from the products alone");
                }
            }
        }
    }
}

static Args args() {
    Args a;
    memset(&a, 0, sizeof a);
    return a;
}

static void test_norms() {
    for (int d : {1, 7, 128, 257, 4096}) {
        // Both block sizes of src/backend/cuda/ops/norm.rs norm_threads: many groups, few groups.
        const int groups = 3, bs_many = std::clamp((d + 31) / 32 * 32, 32, 256);
        const int bs_few = std::max(bs_many, std::clamp(((d + 3) / 4 + 31) / 32 * 32, 32, 1024));
        auto x = normals((size_t)groups * d, 2.0f), w = normals(d), z = normals((size_t)groups * d), acc = normals((size_t)groups * d);
        Buf X = Buf::of(x), W = Buf::of(w), Z = Buf::of(z), A = Buf::of(acc), O(4 * x.size());
        std::vector<double> want(x.size()), wantg(x.size()), wanta(x.size()), acc2(x.size());
        for (int g = 0; g < groups; ++g) {
            double ss = 0, ssa = 0;
            for (int i = 0; i < d; ++i) {
                ss += (double)x[g * d + i] * x[g * d + i];
                acc2[g * d + i] = (double)acc[g * d + i] + x[g * d + i];
                ssa += acc2[g * d + i] * acc2[g * d + i];
            }
            const double s = 1 / std::sqrt(ss / d + 1e-6), sa = 1 / std::sqrt(ssa / d + 1e-6);
            for (int i = 0; i < d; ++i) {
                want[g * d + i] = x[g * d + i] * s * w[i];
                wantg[g * d + i] = want[g * d + i] * silu(z[g * d + i]);
                wanta[g * d + i] = acc2[g * d + i] * sa * w[i];
            }
        }
        // Slot p6: the f16 copy of the output (for the fast path's products), which must be exactly
        // the f32 output rounded to nearest (what pf_f32_to_f16 would write), and must not change it.
        Buf H(2 * x.size());
        auto expect_f16 = [&](const std::string& what) {
            std::vector<float> got(x.size());
            std::vector<double> want16(x.size());
            const std::vector<float> out = O.get<float>(x.size());
            const uint16_t* h = reinterpret_cast<const uint16_t*>(H.p);
            for (size_t i = 0; i < x.size(); ++i) {
                got[i] = __half2float(h[i]);
                want16[i] = __half2float(__float2half_rn(out[i]));
            }
            expect(what + " f16 copy", got, want16, 0, 0);
        };
        for (int k = 0; k < (bs_few == bs_many ? 1 : 2); ++k)
            for (int with16 = 0; with16 < 2; ++with16) {
            const int bs = k ? bs_few : bs_many;
            const std::string tag = " d " + std::to_string(d) + " threads " + std::to_string(bs) + (with16 ? " +f16" : "");
            memcpy(A.p, acc.data(), 4 * acc.size());  // add_rms_norm updates acc in place
            Args a = args();
            a.p[0] = X.addr();
            a.p[1] = W.addr();
            a.p[2] = O.addr();
            a.p[6] = with16 ? H.addr() : 0;
            a.n[0] = d;
            a.f[0] = 1e-6f;
            emu_launch(rms_norm, Dim3{(unsigned)groups, 1, 1}, bs, 0, a);
            expect("rms_norm" + tag, O.get<float>(x.size()), want, 1e-6, 1e-5);
            if (with16) expect_f16("rms_norm" + tag);
            a.p[1] = Z.addr();
            a.p[2] = W.addr();
            a.p[3] = O.addr();
            emu_launch(gated_rms_norm, Dim3{(unsigned)groups, 1, 1}, bs, 0, a);
            expect("gated_rms_norm" + tag, O.get<float>(x.size()), wantg, 1e-6, 1e-5);
            if (with16) expect_f16("gated_rms_norm" + tag);
            a.p[0] = A.addr();
            a.p[1] = X.addr();
            a.p[2] = W.addr();
            a.p[3] = O.addr();
            emu_launch(add_rms_norm, Dim3{(unsigned)groups, 1, 1}, bs, 0, a);
            expect("add_rms_norm out" + tag, O.get<float>(x.size()), wanta, 1e-6, 1e-5);
            expect("add_rms_norm acc" + tag, A.get<float>(x.size()), acc2, 1e-6, 1e-6);
            if (with16) expect_f16("add_rms_norm" + tag);
        }
    }
    // The decode shapes (src/backend/cuda/ops/norm.rs): gated_rms_norm_rows, one block per token row
    // of heads x d values, a warp per head (d up to 1024: 1 to 32 values per lane, 1 to 32 heads
    // per warp), and sigmoid_mul_rows (in place). Their prepared copies are checked on the other
    // emulator (dev/cuda/emu/mvtc_checks.cpp); this host build leaves those slots zero.
    for (auto [heads, d] : {std::pair{32, 128}, {3, 128}, {5, 257}, {2, 1024}, {40, 7}}) {
        const int T = 3, n = heads * d;
        const int bs = std::max(std::clamp((n + 31) / 32 * 32, 32, 256), std::clamp(((n + 3) / 4 + 31) / 32 * 32, 32, 1024));
        auto x = normals((size_t)T * n, 2.0f), z = normals((size_t)T * n), w = normals(d), g = normals((size_t)T * n, 4.0f);
        Buf X = Buf::of(x), Z = Buf::of(z), W = Buf::of(w), O(4 * x.size()), G = Buf::of(g);
        std::vector<double> want(x.size()), wants(x.size());
        for (int r = 0; r < T * heads; ++r) {
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += (double)x[(size_t)r * d + i] * x[(size_t)r * d + i];
            const double sc = 1 / std::sqrt(ss / d + 1e-6);
            for (int i = 0; i < d; ++i) {
                const size_t k = (size_t)r * d + i;
                want[k] = x[k] * sc * w[i] * silu(z[k]);
            }
        }
        for (size_t k = 0; k < x.size(); ++k) wants[k] = x[k] / (1 + std::exp(-(double)g[k]));
        const std::string tag = " heads " + std::to_string(heads) + " d " + std::to_string(d) + " threads " + std::to_string(bs);
        Args a = args();
        a.p[0] = X.addr();
        a.p[1] = Z.addr();
        a.p[2] = W.addr();
        a.p[3] = O.addr();
        a.n[0] = d;
        a.n[1] = n;
        a.f[0] = 1e-6f;
        emu_launch(gated_rms_norm_rows, Dim3{(unsigned)T, 1, 1}, bs, 0, a);
        expect("gated_rms_norm_rows" + tag, O.get<float>(x.size()), want, 1e-6, 1e-5);
        Args b = args();
        b.p[0] = X.addr();
        b.p[1] = G.addr();
        b.n[1] = n;
        emu_launch(sigmoid_mul_rows, Dim3{(unsigned)T, 1, 1}, bs, 0, b);
        expect("sigmoid_mul_rows" + tag, X.get<float>(x.size()), wants, 1e-7, 1e-6);
    }
    // rms_norm_slices_whole (after matmul_add_rms_norm's product): a block per slice of 256 of each
    // token row, every block reading the whole row; the row itself unchanged.
    for (int d : {256, 1280, 2048, 4096}) {
        const int T = 3;
        auto x = normals((size_t)T * d, 3.0f), w = normals(d);
        Buf X = Buf::of(x), W = Buf::of(w), O(4 * x.size());
        std::vector<double> want(x.size()), same(x.begin(), x.end());
        for (int r = 0; r < T; ++r) {
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += (double)x[(size_t)r * d + i] * x[(size_t)r * d + i];
            const double sc = 1 / std::sqrt(ss / d + 1e-6);
            for (int i = 0; i < d; ++i) want[(size_t)r * d + i] = x[(size_t)r * d + i] * sc * w[i];
        }
        Args a = args();
        a.p[0] = X.addr();
        a.p[2] = W.addr();
        a.p[3] = O.addr();
        a.n[0] = d;
        a.f[0] = 1e-6f;
        emu_launch(rms_norm_slices_whole, Dim3{(unsigned)(d / 256), (unsigned)T, 1}, 256, 0, a);
        const std::string tag = " d " + std::to_string(d);
        expect("rms_norm_slices_whole" + tag, O.get<float>(x.size()), want, 1e-6, 1e-5);
        expect("rms_norm_slices_whole row unchanged" + tag, X.get<float>(x.size()), same, 0, 0);
    }
}

// conv1d + SiLU, alone and fused with the q/k L2 norm (and with the delta-rule gates, which must
// equal the gdn_gates kernel's bit for bit), continuing from a state.
static void test_conv() {
    struct G {
        int hk, dk, hv, dv;
    };
    for (G gd : {G{2, 128, 3, 128}, G{3, 5, 5, 7}, G{1, 37, 3, 33}}) {
        const int hk = gd.hk, dk = gd.dk, hv = gd.hv, dv = gd.dv, K = 4;
        const int kd = hk * dk, C = 2 * kd + hv * dv;
        for (int T : {1, 3, 65}) {
            auto x = normals((size_t)T * C), w = normals((size_t)C * K, 0.5f), st = normals((size_t)(K - 1) * C);
            std::vector<double> full((size_t)(K - 1 + T) * C), out((size_t)T * C), state((size_t)(K - 1) * C);
            for (int r = 0; r < K - 1; ++r)
                for (int c = 0; c < C; ++c) full[(size_t)r * C + c] = st[(size_t)r * C + c];
            for (int t = 0; t < T; ++t)
                for (int c = 0; c < C; ++c) full[(size_t)(K - 1 + t) * C + c] = x[(size_t)t * C + c];
            for (int t = 0; t < T; ++t)
                for (int c = 0; c < C; ++c) {
                    double y = 0;
                    for (int j = 0; j < K; ++j) y += w[(size_t)c * K + j] * full[(size_t)(t + j) * C + c];
                    out[(size_t)t * C + c] = silu(y);
                }
            for (int r = 0; r < K - 1; ++r)
                for (int c = 0; c < C; ++c) state[(size_t)r * C + c] = full[(size_t)(T + r) * C + c];
            std::vector<double> normed = out;
            for (int t = 0; t < T; ++t)
                for (int h = 0; h < 2 * hk; ++h) {
                    double ss = 0;
                    for (int i = 0; i < dk; ++i) ss += normed[(size_t)t * C + h * dk + i] * normed[(size_t)t * C + h * dk + i];
                    double s = 1 / std::sqrt(ss + 1e-6);
                    if (h < hk) s /= std::sqrt((double)dk);
                    for (int i = 0; i < dk; ++i) normed[(size_t)t * C + h * dk + i] *= s;
                }
            // The gates' inputs, and their outputs from the gdn_gates kernel (grid-stride, 256).
            const int ng = T * hv;
            auto ga = normals(ng, 6.0f), gb = normals(ng, 4.0f), gsa = normals(hv), gdt = normals(hv);
            ga[0] = -100.0f;  // softplus' underflow and threshold branches
            if (ng > 1) ga[1] = 20.01f;
            for (auto& v : gsa) v = -std::fabs(v) - 0.01f;
            Buf GA = Buf::of(ga), GB = Buf::of(gb), GSA = Buf::of(gsa), GDT = Buf::of(gdt), GG(4 * (size_t)ng), GBE(4 * (size_t)ng);
            {
                Args a = args();
                a.p[0] = GA.addr();
                a.p[1] = GB.addr();
                a.p[2] = GSA.addr();
                a.p[3] = GDT.addr();
                a.p[4] = GG.addr();
                a.p[5] = GBE.addr();
                a.n[0] = ng;
                a.n[1] = hv;
                emu_launch(gdn_gates, Dim3{1, 1, 1}, 256, 0, a);
            }
            const auto g_old = GG.get<float>(ng), beta_old = GBE.get<float>(ng);
            // Tiles of 16 tokens, as the backend launches them (T 65: five block rows).
            const int tt = 16;
            const unsigned tiles = (unsigned)std::max(1, (T + tt - 1) / tt);
            for (int mode = 0; mode < 3; ++mode) {  // conv1d_silu; fused with the norm; and the gates
                Buf X = Buf::of(x), W = Buf::of(w), S = Buf::of(st), O(4 * (size_t)T * C), FG(4 * (size_t)ng), FB(4 * (size_t)ng);
                const std::string what = " hk " + std::to_string(hk) + " dk " + std::to_string(dk) + " hv " +
                                         std::to_string(hv) + " T " + std::to_string(T);
                if (mode > 0) {
                    const int bs = (dk + 31) / 32 * 32, conv_blocks = 2 * hk + (hv * dv + bs - 1) / bs;
                    ConvL2qkParams p{};
                    p.x = reinterpret_cast<const float*>(X.p);
                    p.w = reinterpret_cast<const float*>(W.p);
                    p.state = reinterpret_cast<float*>(S.p);
                    p.out = reinterpret_cast<float*>(O.p);
                    p.T = T;
                    p.C = C;
                    p.K = K;
                    p.tt = tt;
                    p.hk = hk;
                    p.dk = dk;
                    p.conv_blocks = conv_blocks;
                    p.eps = 1e-6f;
                    unsigned blocks = conv_blocks;
                    if (mode == 2) {
                        p.a = reinterpret_cast<const float*>(GA.p);
                        p.b = reinterpret_cast<const float*>(GB.p);
                        p.ssm_a = reinterpret_cast<const float*>(GSA.p);
                        p.dt_bias = reinterpret_cast<const float*>(GDT.p);
                        p.g = reinterpret_cast<float*>(FG.p);
                        p.beta = reinterpret_cast<float*>(FB.p);
                        p.n_gates = ng;
                        p.hv = hv;
                        p.gate_chunk = (ng + (int)tiles - 1) / (int)tiles;
                        blocks += 1;
                    }
                    emu_launch(conv1d_silu_l2qk, Dim3{blocks, tiles, 1}, bs, 0, p);
                    expect(std::string(mode == 2 ? "gdn_conv_gates" : "conv1d_silu_l2qk") + " out" + what,
                           O.get<float>((size_t)T * C), normed, 1e-6, 1e-5);
                    if (mode == 2) {
                        expect("gdn_conv_gates g" + what, FG.get<float>(ng), std::vector<double>(g_old.begin(), g_old.end()), 0, 0);
                        expect("gdn_conv_gates beta" + what, FB.get<float>(ng), std::vector<double>(beta_old.begin(), beta_old.end()), 0, 0);
                    }
                } else {
                    Args a = args();
                    a.p[0] = X.addr();
                    a.p[1] = W.addr();
                    a.p[2] = S.addr();
                    a.p[3] = O.addr();
                    a.n[0] = T;
                    a.n[1] = C;
                    a.n[2] = K;
                    a.n[5] = tt;
                    emu_launch(conv1d_silu, Dim3{(unsigned)((C + 255) / 256), tiles, 1}, 256, 0, a);
                    expect("conv1d_silu out" + what, O.get<float>((size_t)T * C), out, 1e-6, 1e-5);
                }
                expect("conv state" + what + " mode " + std::to_string(mode), S.get<float>((size_t)(K - 1) * C), state, 0, 0);
            }
        }
    }
}

// Row-owned delta rule against spec/DELTANET.md A.2 in double, from a random non-symmetric state.
static void test_delta() {
    for (int dk : {128, 32, 37}) {
        const int hk = 2, hv = 4, dv = dk;
        const int kd = hk * dk, cd = 2 * kd + hv * dv;
        for (int T : {1, 2, 5}) {
            std::vector<float> u = normals((size_t)T * cd), g((size_t)T * hv), be((size_t)T * hv),
                               m0 = normals((size_t)hv * dv * dk, 0.3f);
            for (int t = 0; t < T; ++t)
                for (int h = 0; h < 2 * hk; ++h) {
                    double n = 0;
                    for (int i = 0; i < dk; ++i) n += (double)u[(size_t)t * cd + h * dk + i] * u[(size_t)t * cd + h * dk + i];
                    for (int i = 0; i < dk; ++i)
                        u[(size_t)t * cd + h * dk + i] = (float)(u[(size_t)t * cd + h * dk + i] / std::sqrt(n) / (h < hk ? std::sqrt((double)dk) : 1.0));
                }
            for (auto& v : g) v = -std::fabs(nrand());
            for (auto& v : be) v = (float)(1 / (1 + std::exp(-nrand())));
            std::vector<double> M(m0.begin(), m0.end()), o((size_t)T * hv * dv);
            for (int t = 0; t < T; ++t)
                for (int j = 0; j < hv; ++j) {
                    const int kh = j % hk;
                    const float* q = &u[(size_t)t * cd + kh * dk];
                    const float* k = &u[(size_t)t * cd + kd + kh * dk];
                    const double decay = std::exp((double)g[t * hv + j]), b = be[t * hv + j];
                    for (int c = 0; c < dv; ++c) {
                        double* row = &M[((size_t)j * dv + c) * dk];
                        double kv = 0;
                        for (int i = 0; i < dk; ++i) kv += row[i] * k[i];
                        const double delta = b * (u[(size_t)t * cd + 2 * kd + j * dv + c] - decay * kv);
                        double oo = 0;
                        for (int i = 0; i < dk; ++i) {
                            row[i] = decay * row[i] + delta * k[i];
                            oo += row[i] * q[i];
                        }
                        o[(size_t)t * hv * dv + j * dv + c] = oo;
                    }
                }
            Buf U = Buf::of(u), G = Buf::of(g), B = Buf::of(be), S = Buf::of(m0), O(4 * (size_t)T * hv * dv);
            Args a = args();
            a.p[0] = U.addr();
            a.p[1] = G.addr();
            a.p[2] = B.addr();
            a.p[3] = S.addr();
            a.p[4] = O.addr();
            a.n[0] = T;
            a.n[1] = hk;
            a.n[2] = hv;
            a.n[3] = dk;
            a.n[4] = dv;
            emu_launch(dk <= 128 ? delta_rule_4 : delta_rule_8, Dim3{(unsigned)hv, (unsigned)((dv + 3) / 4), 1}, 128, 0, a);
            const std::string what = " dk " + std::to_string(dk) + " T " + std::to_string(T);
            expect("delta out" + what, O.get<float>((size_t)T * hv * dv), o, 1e-5, 1e-4);
            expect("delta state" + what, S.get<float>(M.size()), M, 1e-5, 1e-4);
        }
    }
}

// kv_store of T rows of width W into caches of ctx rows at the position in P, as the backend
// launches it (one block suffices for a grid-stride loop).
static void run_kv_store(const Buf& k, const Buf& v, const Buf& kc, const Buf& vc, const Buf& P, int T, int W, int ctx) {
    Args s = args();
    s.p[0] = k.addr();
    s.p[1] = v.addr();
    s.p[2] = kc.addr();
    s.p[3] = vc.addr();
    s.p[4] = P.addr();
    s.n[0] = (long long)T * W;
    s.n[1] = W;
    s.n[2] = ctx;
    emu_launch(kv_store, Dim3{1, 1, 1}, 256, 0, s);
}

// rope_neox in place on x [T, heads*D] at the position in P, with the backend's launch geometry.
static void run_rope(const Buf& x, const Buf& P, int heads, int T, int D, int n_rot, float theta) {
    Args r = args();
    r.p[0] = x.addr();
    r.p[1] = P.addr();
    r.n[0] = heads;
    r.n[1] = D;
    r.n[2] = n_rot;
    r.f[0] = theta;
    if (n_rot >= 2) emu_launch(rope_neox, Dim3{(unsigned)heads, (unsigned)T, 1}, std::clamp((n_rot / 2 + 31) / 32 * 32, 32, 256), 0, r);
}

// RoPE, the KV store and split attention with its merge, positions read from device memory.
static void test_attention() {
    struct D {
        int h, hkv, dh;
    };
    for (D dm : {D{4, 2, 64}, D{4, 1, 5}, D{2, 1, 256}, D{16, 4, 256}}) {
        for (int T : {1, 3}) {
            for (int pos : {0, 7, 130}) {
                const int ctx = pos + T + 3, W = dm.hkv * dm.dh;
                auto q = normals((size_t)T * dm.h * dm.dh), kc = normals((size_t)ctx * W), vc = normals((size_t)ctx * W);
                auto knew = normals((size_t)T * W), vnew = normals((size_t)T * W);
                std::vector<uint32_t> pv = {(uint32_t)pos};
                Buf P = Buf::of(pv), K = Buf::of(kc), V = Buf::of(vc), KN = Buf::of(knew), VN = Buf::of(vnew);
                // KV store of the T new rows.
                run_kv_store(KN, VN, K, V, P, T, W, ctx);
                for (int t = 0; t < T; ++t)
                    for (int i = 0; i < W; ++i) {
                        kc[(size_t)(pos + t) * W + i] = knew[(size_t)t * W + i];
                        vc[(size_t)(pos + t) * W + i] = vnew[(size_t)t * W + i];
                    }
                const std::string what = " h " + std::to_string(dm.h) + "/" + std::to_string(dm.hkv) + " D " +
                                         std::to_string(dm.dh) + " T " + std::to_string(T) + " pos " + std::to_string(pos);
                expect("kv_store" + what, K.get<float>(kc.size()), std::vector<double>(kc.begin(), kc.end()), 0, 0);
                // RoPE on q (n_rot = min(64, D) rounded down to even).
                const int n_rot = std::min(64, dm.dh) / 2 * 2;
                std::vector<double> qr(q.begin(), q.end());
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < dm.h; ++h)
                        for (int i = 0; i < n_rot / 2; ++i) {
                            const double f = std::pow(1e7, -2.0 * i / n_rot), an = (pos + t) * f;
                            const float c = (float)std::cos(an), sn = (float)std::sin(an);
                            double& a0 = qr[((size_t)t * dm.h + h) * dm.dh + i];
                            double& a1 = qr[((size_t)t * dm.h + h) * dm.dh + i + n_rot / 2];
                            const double x0 = a0, x1 = a1;
                            a0 = x0 * c - x1 * sn;
                            a1 = x0 * sn + x1 * c;
                        }
                Buf Q = Buf::of(q);
                run_rope(Q, P, dm.h, T, dm.dh, n_rot, 1e7f);
                auto qg = Q.get<float>(q.size());
                expect("rope" + what, qg, qr, 1e-5, 1e-5);
                // Attention over rows 0..pos+t of the caches.
                std::vector<double> want((size_t)T * dm.h * dm.dh, 0.0);
                const double scale = 1 / std::sqrt((double)dm.dh);
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < dm.h; ++h) {
                        const int kvh = h / (dm.h / dm.hkv), n = pos + t + 1;
                        std::vector<double> sc(n);
                        double mx = -INFINITY, sum = 0;
                        for (int j = 0; j < n; ++j) {
                            double d = 0;
                            for (int i = 0; i < dm.dh; ++i) d += (double)qg[((size_t)t * dm.h + h) * dm.dh + i] * kc[(size_t)j * W + kvh * dm.dh + i];
                            sc[j] = d * scale;
                            mx = std::max(mx, sc[j]);
                        }
                        for (int j = 0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
                        for (int j = 0; j < n; ++j)
                            for (int i = 0; i < dm.dh; ++i)
                                want[((size_t)t * dm.h + h) * dm.dh + i] += sc[j] / sum * vc[(size_t)j * W + kvh * dm.dh + i];
                    }
                for (int S : {1, 3, 17}) {
                    if (T > 1 && S > 1) continue;  // the backend splits only one-token steps
                    Buf O(4 * want.size()), Part(4 * (size_t)T * dm.h * S * (dm.dh + 2));
                    Args a = args();
                    a.p[0] = Q.addr();
                    a.p[1] = K.addr();
                    a.p[2] = V.addr();
                    a.p[3] = O.addr();
                    a.p[4] = P.addr();
                    a.p[5] = S > 1 ? Part.addr() : 0;
                    a.n[0] = dm.h;
                    a.n[1] = dm.hkv;
                    a.n[2] = dm.dh;
                    a.n[3] = S;
                    a.n[4] = ctx;
                    a.f[0] = (float)scale;
                    emu_launch(attn_split, Dim3{(unsigned)dm.h, (unsigned)T, (unsigned)S}, 128, 0, a);
                    if (S > 1) {
                        Args c = args();
                        c.p[0] = Part.addr();
                        c.p[1] = O.addr();
                        c.n[0] = dm.h;
                        c.n[1] = dm.dh;
                        c.n[2] = S;
                        emu_launch(attn_combine, Dim3{(unsigned)dm.h, (unsigned)T, 1}, 128, 0, c);
                    }
                    expect("attention S " + std::to_string(S) + what, O.get<float>(want.size()), want, 5e-6, 1e-4);
                }
            }
        }
    }
}

// attn_qk_prep (one launch) against the six launches it replaces (split_qgate, rms_norm of q and
// of k, rope_neox of both, kv_store), each with the backend's launch geometry: bit for bit, on
// random data with odd head counts and sizes, partial and no rotation, and a cache too short for
// the last rows (kv_store skips them; so must the fused kernel).
static void test_attn_prep() {
    struct D {
        int h, hkv, dh, n_rot;
    };
    const float theta = 1e7f, eps = 1e-6f;
    for (D dm : {D{4, 2, 64, 16}, D{3, 1, 5, 4}, D{8, 2, 256, 64}, D{2, 2, 37, 0}, D{3, 3, 40, 40}, D{2, 1, 300, 62}}) {
        const int bs = std::clamp((dm.dh + 31) / 32 * 32, 32, 256);  // group_threads(D)
        for (int T : {1, 3}) {
            for (int pos : {0, 1000}) {
                for (int short_cache = 0; short_cache < 2; ++short_cache) {
                    if (short_cache && (T == 1 || pos == 0)) continue;
                    const int ctx = short_cache ? pos + T - 1 : pos + T + 2, W = dm.hkv * dm.dh, QW = dm.h * dm.dh;
                    auto qg = normals((size_t)T * 2 * QW, 2.0f), k = normals((size_t)T * W, 2.0f), v = normals((size_t)T * W);
                    auto qn = normals(dm.dh), kn = normals(dm.dh);
                    auto kc0 = normals((size_t)ctx * W), vc0 = normals((size_t)ctx * W);
                    std::vector<uint32_t> pv = {(uint32_t)pos};
                    Buf P = Buf::of(pv), QG = Buf::of(qg), Kb = Buf::of(k), Vb = Buf::of(v), QN = Buf::of(qn), KN = Buf::of(kn);
                    // The composition.
                    Buf Q(4 * (size_t)T * QW), G1(4 * (size_t)T * QW), QO1(4 * (size_t)T * QW), KO1(4 * (size_t)T * W);
                    Buf KC1 = Buf::of(kc0), VC1 = Buf::of(vc0);
                    Args s = args();
                    s.p[0] = QG.addr();
                    s.p[1] = Q.addr();
                    s.p[2] = G1.addr();
                    s.n[0] = (long long)T * QW;
                    s.n[1] = dm.dh;
                    emu_launch(split_qgate, Dim3{1, 1, 1}, 256, 0, s);
                    for (int side = 0; side < 2; ++side) {
                        Args n = args();
                        n.p[0] = side ? Kb.addr() : Q.addr();
                        n.p[1] = side ? KN.addr() : QN.addr();
                        n.p[2] = side ? KO1.addr() : QO1.addr();
                        n.n[0] = dm.dh;
                        n.f[0] = eps;
                        const int heads = side ? dm.hkv : dm.h;
                        emu_launch(rms_norm, Dim3{(unsigned)(T * heads), 1, 1}, bs, 0, n);
                        run_rope(side ? KO1 : QO1, P, heads, T, dm.dh, dm.n_rot, theta);
                    }
                    run_kv_store(KO1, Vb, KC1, VC1, P, T, W, ctx);
                    // The fused kernel.
                    Buf G2(4 * (size_t)T * QW), QO2(4 * (size_t)T * QW), KO2(4 * (size_t)T * W);
                    Buf KC2 = Buf::of(kc0), VC2 = Buf::of(vc0);
                    QkPrepParams p{};
                    p.qg = reinterpret_cast<const float*>(QG.p);
                    p.k = reinterpret_cast<const float*>(Kb.p);
                    p.v = reinterpret_cast<const float*>(Vb.p);
                    p.q_norm = reinterpret_cast<const float*>(QN.p);
                    p.k_norm = reinterpret_cast<const float*>(KN.p);
                    p.gate = reinterpret_cast<float*>(G2.p);
                    p.q_normed = reinterpret_cast<float*>(QO2.p);
                    p.k_normed = reinterpret_cast<float*>(KO2.p);
                    p.k_cache = reinterpret_cast<float*>(KC2.p);
                    p.v_cache = reinterpret_cast<float*>(VC2.p);
                    p.pos = reinterpret_cast<const uint32_t*>(P.p);
                    p.tq = p.tk = T;
                    p.nh = dm.h;
                    p.nkv = dm.hkv;
                    p.d = dm.dh;
                    p.n_rot = dm.n_rot;
                    p.ctx = ctx;
                    p.theta = theta;
                    p.eps = eps;
                    emu_launch(attn_qk_prep, Dim3{(unsigned)(dm.h + dm.hkv), (unsigned)T, 1}, bs, 0, p);
                    const std::string what = " h " + std::to_string(dm.h) + "/" + std::to_string(dm.hkv) + " D " +
                                             std::to_string(dm.dh) + " n_rot " + std::to_string(dm.n_rot) + " T " +
                                             std::to_string(T) + " pos " + std::to_string(pos) + " ctx " + std::to_string(ctx);
                    auto same = [&](const char* name, const Buf& got, const Buf& want, size_t n) {
                        const auto w = want.get<float>(n);
                        expect(std::string("attn_qk_prep ") + name + what, got.get<float>(n), std::vector<double>(w.begin(), w.end()), 0, 0);
                    };
                    same("gate", G2, G1, (size_t)T * QW);
                    same("q", QO2, QO1, (size_t)T * QW);
                    same("k", KO2, KO1, (size_t)T * W);
                    same("k cache", KC2, KC1, (size_t)ctx * W);
                    same("v cache", VC2, VC1, (size_t)ctx * W);
                }
            }
        }
    }
}

// MoE routing: softmax, top-k with ties to the lower index, renormalise, scale; the block kernel
// and the rank kernel (E <= 1024) with the backend's launch geometry.
static void test_route(void (*kernel)(const Args), const char* name, int E, int k, bool rank) {
    const int T = 3;
    auto l = normals((size_t)T * E, 2.0f);
    l[3] = l[9] = 9.0f;  // a tie in token 0
    l[E + 1] = l[E + 33] = l[E + E - 1] = 7.0f;  // ties across lanes in token 1
    Buf L = Buf::of(l), I(4 * T * k), Wt(4 * T * k);
    Args a = args();
    a.p[0] = L.addr();
    a.p[1] = I.addr();
    a.p[2] = Wt.addr();
    a.n[0] = E;
    a.n[1] = k;
    a.f[0] = 1.5f;
    if (rank)
        emu_launch(kernel, Dim3{(unsigned)T, 1, 1}, 256, 0, a);
    else
        emu_launch(kernel, Dim3{(unsigned)T, 1, 1}, 256, (size_t)E * 4 + (E + 3) / 4 * 4, a);
    auto ids = I.get<uint32_t>(T * k);
    auto ws = Wt.get<float>(T * k);
    std::vector<double> wantw(T * k);
    bool ids_ok = true;
    for (int t = 0; t < T; ++t) {
        std::vector<double> p(E);
        double mx = -INFINITY, s = 0;
        for (int e = 0; e < E; ++e) mx = std::max(mx, (double)l[t * E + e]);
        for (int e = 0; e < E; ++e) s += (p[e] = std::exp(l[t * E + e] - mx));
        std::vector<int> order(E);
        for (int e = 0; e < E; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p[x] > p[y]; });
        double sel = 0;
        for (int j = 0; j < k; ++j) sel += p[order[j]] / s;
        for (int j = 0; j < k; ++j) {
            ids_ok &= ids[t * k + j] == (uint32_t)order[j];
            wantw[t * k + j] = p[order[j]] / s / sel * 1.5;
        }
    }
    checks++;
    if (!ids_ok) {
        failures++;
        printf("FAIL %s ids (E %d k %d)\n", name, E, k);
    }
    expect(std::string(name) + " weights E " + std::to_string(E) + " k " + std::to_string(k), ws, wantw, 1e-7, 1e-5);
}

// norm.cu moe_norm_route (one token of a MoE FFN's input): the residual add and norm against f64,
// the router and shared-gate logits against f64 dots of the kernel's own normed row (the router
// blocks' copies must be its bits), the routing bit for bit moe_route_rank's on those logits, the
// counter back at zero.
static void test_norm_route() {
    for (auto [d, E] : {std::pair{512, 37}, {2048, 256}, {256, 1000}}) {
        const int k = 8, nsl = d / 256, blocks = nsl + (E + 1 + 7) / 8;
        auto h = normals(d), y = normals(d), w = normals(d), r = normals((size_t)E * d, 0.05f), g = normals(d, 0.05f);
        Buf H = Buf::of(h), Y = Buf::of(y), W = Buf::of(w), R = Buf::of(r), G = Buf::of(g), X(4 * d), L(4 * E), SG(4),
            I(4 * k), Wt(4 * k), C(4);
        Args a = args();
        a.p[0] = H.addr();
        a.p[1] = Y.addr();
        a.p[2] = W.addr();
        a.p[3] = X.addr();
        a.p[6] = R.addr();
        a.n[0] = d;
        a.n[1] = E;
        a.n[2] = k;
        a.n[3] = (long long)G.addr();
        a.n[4] = (long long)L.addr();
        a.n[5] = (long long)SG.addr();
        a.n[6] = (long long)I.addr();
        a.n[7] = (long long)Wt.addr();
        a.n[8] = (long long)C.addr();
        a.f[0] = 1e-6f;
        a.f[1] = 2.5f;
        emu_launch(moe_norm_route, Dim3{(unsigned)blocks, 1, 1}, 256, (size_t)d * 4, a);
        const std::string tag = " d " + std::to_string(d) + " E " + std::to_string(E);
        std::vector<double> v(d), want(d);
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += (v[i] = (double)(h[i] + y[i])) * v[i];
        const double sc = 1 / std::sqrt(ss / d + 1e-6);
        for (int i = 0; i < d; ++i) want[i] = v[i] * sc * w[i];
        const auto x = X.get<float>(d);
        expect("moe_norm_route normed" + tag, x, want, 1e-6, 1e-5);
        expect("moe_norm_route residual" + tag, H.get<float>(d), v, 0, 0);
        std::vector<double> lw(E + 1), mag(E + 1);
        for (int e = 0; e <= E; ++e)
            for (int i = 0; i < d; ++i) {
                const double t = (double)(e < E ? r[(size_t)e * d + i] : g[i]) * x[i];
                lw[e] += t;
                mag[e] += std::fabs(t);
            }
        auto got = L.get<float>(E);
        got.push_back(SG.get<float>(1)[0]);
        expect("moe_norm_route logits" + tag, got, lw, 0, 1e-5, &mag);
        // The routing against moe_route_rank on the same logits.
        Buf I2(4 * k), W2(4 * k);
        Args b = args();
        b.p[0] = L.addr();
        b.p[1] = I2.addr();
        b.p[2] = W2.addr();
        b.n[0] = E;
        b.n[1] = k;
        b.f[0] = 2.5f;
        emu_launch(moe_route_rank, Dim3{1, 1, 1}, 256, 0, b);
        checks++;
        if (memcmp(I.p, I2.p, 4 * k) || memcmp(Wt.p, W2.p, 4 * k) || C.get<uint32_t>(1)[0] != 0) {
            failures++;
            printf("FAIL moe_norm_route routing or counter%s\n", tag.c_str());
        }
    }
}

static void test_route_argmax_elementwise() {
    test_norm_route();
    test_route(moe_route, "moe_route", 37, 5, false);
    for (int E : {37, 256, 512, 1000}) test_route(moe_route_rank, "moe_route_rank", E, E == 37 ? 37 : 8, true);
    test_route(moe_route_rank, "moe_route_rank", 1024, 300, true);

    // argmax: ties, NaN, -inf, all-NaN rows (NON_FINITE), over a row longer than one block's chunk.
    const int V = 10000, R = 5;
    std::vector<float> x = normals((size_t)R * V);
    x[7] = x[9000] = 50.0f;                           // row 0: tie -> 7
    x[V + 0] = NAN, x[V + 5] = 60.0f;                 // row 1: NaN never wins -> 5
    for (int i = 0; i < V; ++i) x[2 * V + i] = NAN;   // row 2: all NaN -> NON_FINITE
    for (int i = 0; i < V; ++i) x[3 * V + i] = -INFINITY;
    x[3 * V + 4444] = -1e30f;                         // row 3: one number among -inf -> 4444
    x[4 * V + 6000] = INFINITY;                       // row 4: +inf wins -> 6000
    const int parts = std::clamp((V + 4095) / 4096, 1, 1024), chunk = (V + parts - 1) / parts;
    Buf X = Buf::of(x), Part(8 * R * parts), Out(4 * R);
    Args p = args();
    p.p[0] = X.addr();
    p.p[1] = Part.addr();
    p.n[0] = V;
    p.n[1] = chunk;
    emu_launch(argmax_partial, Dim3{(unsigned)parts, R, 1}, 256, 0, p);
    Args f = args();
    f.p[0] = Part.addr();
    f.p[1] = Out.addr();
    f.n[0] = parts;
    emu_launch(argmax_final, Dim3{R, 1, 1}, 32, 0, f);
    auto am = Out.get<uint32_t>(R);
    checks++;
    if (am != std::vector<uint32_t>{7, 5, 0xFFFFFFFFu, 4444, 6000}) {
        failures++;
        printf("FAIL argmax: %u %u %u %u %u\n", am[0], am[1], am[2], am[3], am[4]);
    }

    // split_qgate and gdn_gates.
    const int T2 = 3, H = 2, Dh = 5, n = T2 * H * Dh;
    auto qg = normals(2 * n);
    Buf QG = Buf::of(qg), Q(4 * n), Gt(4 * n);
    Args s = args();
    s.p[0] = QG.addr();
    s.p[1] = Q.addr();
    s.p[2] = Gt.addr();
    s.n[0] = n;
    s.n[1] = Dh;
    emu_launch(split_qgate, Dim3{1, 1, 1}, 256, 0, s);
    std::vector<double> wq(n), wg(n);
    for (int hh = 0; hh < T2 * H; ++hh)
        for (int i = 0; i < Dh; ++i) {
            wq[hh * Dh + i] = qg[2 * hh * Dh + i];
            wg[hh * Dh + i] = qg[2 * hh * Dh + Dh + i];
        }
    expect("split_qgate q", Q.get<float>(n), wq, 0, 0);
    expect("split_qgate gate", Gt.get<float>(n), wg, 0, 0);
}

// gdn_step.cu (one launch) against the three launches it replaces, on the same inputs, for two
// tokens in a row (the states and the counters carry over): the conv state moves values only
// (exact); the rest is the same arithmetic up to the order of the q/k norms' sums, and the gated
// norm is checked against a double reference on the three launches' delta-rule outputs.
static void test_gdn_step() {
    struct Shape {
        int hk, hv, dk;
    };
    for (Shape sh : {Shape{2, 4, 128}, Shape{2, 2, 128}, Shape{1, 4, 64}, Shape{4, 8, 32}}) {
        const int hk = sh.hk, hv = sh.hv, dk = sh.dk, dv = dk, K = 4;
        const int kd = hk * dk, C = 2 * kd + hv * dv, n = hv * dv;
        std::vector<float> w = normals((size_t)C * K, 0.5f), st = normals((size_t)(K - 1) * C), m0 = normals((size_t)hv * dv * dk, 0.3f);
        std::vector<float> sa(hv), dt = normals(hv), nw = normals(dv);
        for (auto& v : sa) v = -std::fabs(nrand());
        Buf W = Buf::of(w), SA = Buf::of(sa), DT = Buf::of(dt), NW = Buf::of(nw);
        Buf S1 = Buf::of(st), M1 = Buf::of(m0), S2 = Buf::of(st), M2 = Buf::of(m0);  // unfused, fused
        Buf U(4 * (size_t)C), G(4 * (size_t)hv), BE(4 * (size_t)hv), O1(4 * (size_t)n), O2(4 * (size_t)n), OUT(4 * (size_t)n);
        Buf CNT(4 * 64);
        const std::string what = " hk " + std::to_string(hk) + " hv " + std::to_string(hv) + " dk " + std::to_string(dk);
        for (int tok = 0; tok < 2; ++tok) {
            Buf X = Buf::of(normals(C)), A = Buf::of(normals(hv)), B = Buf::of(normals(hv)), Z = Buf::of(normals(n));
            // The three launches: conv + norm + gates, delta rule; the gated norm in double.
            ConvL2qkParams p{};
            p.x = reinterpret_cast<const float*>(X.p);
            p.w = reinterpret_cast<const float*>(W.p);
            p.state = reinterpret_cast<float*>(S1.p);
            p.out = reinterpret_cast<float*>(U.p);
            p.a = reinterpret_cast<const float*>(A.p);
            p.b = reinterpret_cast<const float*>(B.p);
            p.ssm_a = reinterpret_cast<const float*>(SA.p);
            p.dt_bias = reinterpret_cast<const float*>(DT.p);
            p.g = reinterpret_cast<float*>(G.p);
            p.beta = reinterpret_cast<float*>(BE.p);
            p.T = 1, p.C = C, p.K = K, p.tt = 16, p.hk = hk, p.dk = dk;
            const int bs = (dk + 31) / 32 * 32;
            p.conv_blocks = 2 * hk + (hv * dv + bs - 1) / bs;
            p.n_gates = hv, p.hv = hv, p.gate_chunk = hv;
            p.eps = 1e-6f;
            emu_launch(conv1d_silu_l2qk, Dim3{(unsigned)p.conv_blocks + 1, 1, 1}, bs, 0, p);
            Args a = args();
            a.p[0] = U.addr();
            a.p[1] = G.addr();
            a.p[2] = BE.addr();
            a.p[3] = M1.addr();
            a.p[4] = O1.addr();
            a.n[0] = 1, a.n[1] = hk, a.n[2] = hv, a.n[3] = dk, a.n[4] = dv;
            emu_launch(delta_rule_4, Dim3{(unsigned)hv, (unsigned)((dv + 3) / 4), 1}, 128, 0, a);
            const std::vector<float> o1 = O1.get<float>(n), z = Z.get<float>(n);
            std::vector<double> want(n);
            for (int j = 0; j < hv; ++j) {
                double ss = 0;
                for (int c = 0; c < dv; ++c) ss += (double)o1[j * dv + c] * o1[j * dv + c];
                const double s = 1 / std::sqrt(ss / dv + 1e-6);
                for (int c = 0; c < dv; ++c) {
                    const double zz = z[j * dv + c];
                    want[j * dv + c] = o1[j * dv + c] * s * nw[c] * (zz / (1 + std::exp(-zz)));
                }
            }
            // The one launch.
            GdnStepParams q{};
            q.qkv = reinterpret_cast<const float*>(X.p);
            q.conv_w = reinterpret_cast<const float*>(W.p);
            q.conv_state = reinterpret_cast<float*>(S2.p);
            q.a = reinterpret_cast<const float*>(A.p);
            q.b = reinterpret_cast<const float*>(B.p);
            q.ssm_a = reinterpret_cast<const float*>(SA.p);
            q.dt_bias = reinterpret_cast<const float*>(DT.p);
            q.state = reinterpret_cast<float*>(M2.p);
            q.z = reinterpret_cast<const float*>(Z.p);
            q.norm_w = reinterpret_cast<const float*>(NW.p);
            q.o = reinterpret_cast<float*>(O2.p);
            q.out = reinterpret_cast<float*>(OUT.p);
            q.counters = reinterpret_cast<unsigned*>(CNT.p);
            q.C = C, q.hk = hk, q.hv = hv, q.dk = dk, q.dv = dv;
            q.eps_l2 = 1e-6f, q.eps = 1e-6f;
            emu_launch(gdn_step, Dim3{(unsigned)(n / GS_ROWS), 1, 1}, 256, 0, q);
            const std::string t = what + " token " + std::to_string(tok);
            const auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
            expect("gdn_step conv state" + t, S2.get<float>((size_t)(K - 1) * C), d(S1.get<float>((size_t)(K - 1) * C)), 0, 0);
            expect("gdn_step o" + t, O2.get<float>(n), d(o1), 1e-5, 1e-5);
            expect("gdn_step delta state" + t, M2.get<float>(m0.size()), d(M1.get<float>(m0.size())), 1e-5, 1e-5);
            expect("gdn_step out" + t, OUT.get<float>(n), want, 1e-5, 1e-4);
            const std::vector<unsigned> cnt = CNT.get<unsigned>(64);
            expect("gdn_step counters zero" + t, std::vector<float>(cnt.begin(), cnt.end()), std::vector<double>(64, 0.0), 0, 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rows.cu: the ops of a step whose rows belong to different sequences (src/backend/rows.rs), with
// the launch geometry of src/backend/cuda/ops/rows.rs. Each row names a slot of a pool with more
// slots than rows (shuffled: a kernel that took row b's slot for slot b fails) and a position;
// the references are written per row against the pools' layouts in double. The slots no row
// names must come back bit for bit, and outputs start as NaN so that a row left unwritten shows.

// B rows over a pool of n_slots (> B): distinct slots in shuffled order, the last among them;
// positions `first` (cut to B), then random ones below `below`.
static std::vector<uint32_t> make_rows(int B, int n_slots, uint32_t below, std::vector<uint32_t> first) {
    std::vector<uint32_t> perm(n_slots);
    for (int s = 0; s < n_slots; ++s) perm[s] = (uint32_t)s;
    for (int s = n_slots - 1; s > 0; --s) std::swap(perm[s], perm[rnd() % (uint64_t)(s + 1)]);
    // The pool's last slot is always some row's (its end is the pool's end).
    const int last = (int)(std::find(perm.begin(), perm.end(), (uint32_t)(n_slots - 1)) - perm.begin());
    if (last >= B) std::swap(perm[last], perm[rnd() % (uint64_t)B]);
    std::vector<uint32_t> rv(2 * (size_t)B);
    for (int b = 0; b < B; ++b) {
        rv[2 * b] = perm[b];
        rv[2 * b + 1] = b < (int)first.size() ? first[b] : (uint32_t)(rnd() % below);
    }
    return rv;
}

static std::vector<bool> used_slots(const std::vector<uint32_t>& rv, int n_slots) {
    std::vector<bool> used(n_slots, false);
    for (size_t b = 0; b < rv.size() / 2; ++b) used[rv[2 * b]] = true;
    return used;
}

// The pool's slots that no row names, bit for bit as they were.
static void expect_untouched(const std::string& what, const Buf& pool, const std::vector<float>& orig,
                             size_t slot_floats, const std::vector<bool>& used) {
    checks++;
    for (size_t s = 0; s < used.size(); ++s)
        if (!used[s] && memcmp(pool.p + s * slot_floats * 4, orig.data() + s * slot_floats, slot_floats * 4)) {
            failures++;
            printf("FAIL %s: slot %zu, named by no row, changed\n", what.c_str(), s);
            return;
        }
}

// The rows' slots of a pool (in row order), as floats from the device and as the reference.
static void expect_slots(const std::string& what, const Buf& pool, const std::vector<double>& want, size_t slot_floats,
                         const std::vector<uint32_t>& rv, double atol, double rtol) {
    const float* p = reinterpret_cast<const float*>(pool.p);
    std::vector<float> g;
    std::vector<double> w;
    for (size_t b = 0; b < rv.size() / 2; ++b) {
        const size_t at = rv[2 * b] * slot_floats;
        g.insert(g.end(), p + at, p + at + slot_floats);
        w.insert(w.end(), want.begin() + at, want.begin() + at + slot_floats);
    }
    expect(what, g, w, atol, rtol);
}

static std::string rows_tag(int B, int n_slots) {
    return " B " + std::to_string(B) + " slots " + std::to_string(n_slots);
}

// Conv1d + SiLU of each row's token on its slot's state [K-1, C] (the tolerances of test_conv).
static void test_rows_conv(int C, int K, int B, int n_slots) {
    const auto rv = make_rows(B, n_slots, 1, {});
    const auto used = used_slots(rv, n_slots);
    const size_t sf = (size_t)(K - 1) * C;
    auto x = normals((size_t)B * C), w = normals((size_t)C * K, 0.5f), st = normals(n_slots * sf);
    std::vector<double> out((size_t)B * C), state(st.begin(), st.end());
    for (int b = 0; b < B; ++b) {
        double* s = &state[rv[2 * b] * sf];
        for (int c = 0; c < C; ++c) {
            double y = 0;
            for (int j = 0; j < K - 1; ++j) y += (double)w[(size_t)c * K + j] * s[(size_t)j * C + c];
            y += (double)w[(size_t)c * K + K - 1] * x[(size_t)b * C + c];
            out[(size_t)b * C + c] = silu(y);
            for (int j = 0; j < K - 2; ++j) s[(size_t)j * C + c] = s[(size_t)(j + 1) * C + c];
            s[(size_t)(K - 2) * C + c] = x[(size_t)b * C + c];
        }
    }
    Buf X = Buf::of(x), W = Buf::of(w), S = Buf::of(st), O(4 * (size_t)B * C), R = Buf::of(rv);
    memset(O.p, 0xFF, O.n);
    Args a = args();
    a.p[0] = X.addr();
    a.p[1] = W.addr();
    a.p[2] = S.addr();
    a.p[3] = O.addr();
    a.p[4] = R.addr();
    a.n[0] = C;
    a.n[1] = K;
    emu_launch(rows_conv1d_silu, Dim3{(unsigned)((C + 255) / 256), (unsigned)B, 1}, 256, 0, a);
    const std::string what = " C " + std::to_string(C) + " K " + std::to_string(K) + rows_tag(B, n_slots);
    expect("rows_conv1d_silu out" + what, O.get<float>((size_t)B * C), out, 1e-6, 1e-5);
    expect_slots("rows_conv1d_silu state" + what, S, state, sf, rv, 0, 0);
    expect_untouched("rows_conv1d_silu state" + what, S, st, sf, used);
}

// The variant ops/rows.rs `delta_rule` launches for dk, and which ones ran.
static bool rows_delta_ran[3];
static void test_rows_delta(int hk, int hv, int dk, int dv, int B, int n_slots) {
    const int kd = hk * dk, cd = 2 * kd + hv * dv;
    const size_t sf = (size_t)hv * dv * dk;
    const auto rv = make_rows(B, n_slots, 1, {});
    const auto used = used_slots(rv, n_slots);
    // q and k L2-normed (q also by 1/sqrt(dk)) as the conv kernel leaves them: test_delta's data.
    std::vector<float> u = normals((size_t)B * cd), g((size_t)B * hv), be((size_t)B * hv), m0 = normals(n_slots * sf, 0.3f);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < 2 * hk; ++h) {
            float* v = &u[(size_t)b * cd + h * dk];
            double n = 0;
            for (int i = 0; i < dk; ++i) n += (double)v[i] * v[i];
            for (int i = 0; i < dk; ++i) v[i] = (float)(v[i] / std::sqrt(n) / (h < hk ? std::sqrt((double)dk) : 1.0));
        }
    for (auto& v : g) v = -std::fabs(nrand());
    for (auto& v : be) v = (float)(1 / (1 + std::exp(-nrand())));
    std::vector<double> M(m0.begin(), m0.end()), o((size_t)B * hv * dv);
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < hv; ++j) {
            const float* q = &u[(size_t)b * cd + (j % hk) * dk];
            const float* k = &u[(size_t)b * cd + kd + (j % hk) * dk];
            const double decay = std::exp((double)g[(size_t)b * hv + j]), bt = be[(size_t)b * hv + j];
            for (int c = 0; c < dv; ++c) {
                double* row = &M[rv[2 * b] * sf + ((size_t)j * dv + c) * dk];
                double kv = 0;
                for (int i = 0; i < dk; ++i) kv += row[i] * k[i];
                const double delta = bt * (u[(size_t)b * cd + 2 * kd + j * dv + c] - decay * kv);
                double oo = 0;
                for (int i = 0; i < dk; ++i) {
                    row[i] = decay * row[i] + delta * k[i];
                    oo += row[i] * q[i];
                }
                o[(size_t)b * hv * dv + j * dv + c] = oo;
            }
        }
    Buf U = Buf::of(u), G = Buf::of(g), BE = Buf::of(be), S = Buf::of(m0), O(4 * (size_t)B * hv * dv), R = Buf::of(rv);
    memset(O.p, 0xFF, O.n);
    Args a = args();
    a.p[0] = U.addr();
    a.p[1] = G.addr();
    a.p[2] = BE.addr();
    a.p[3] = S.addr();
    a.p[4] = O.addr();
    a.p[5] = R.addr();
    a.n[1] = hk;
    a.n[2] = hv;
    a.n[3] = dk;
    a.n[4] = dv;
    const int v = dk <= 128 ? 0 : dk <= 256 ? 1 : 2;
    rows_delta_ran[v] = true;
    void (*kernel)(const Args) = v == 0 ? rows_delta_rule_4 : v == 1 ? rows_delta_rule_8 : rows_delta_rule_16;
    emu_launch(kernel, Dim3{(unsigned)hv, (unsigned)((dv + 3) / 4), (unsigned)B}, 128, 0, a);
    const std::string what = std::string(v == 0 ? "_4" : v == 1 ? "_8" : "_16") + " hk " + std::to_string(hk) + " hv " +
                             std::to_string(hv) + " dk " + std::to_string(dk) + " dv " + std::to_string(dv) + rows_tag(B, n_slots);
    expect("rows_delta_rule" + what + " out", O.get<float>(o.size()), o, 1e-5, 1e-4);
    expect_slots("rows_delta_rule" + what + " state", S, M, sf, rv, 1e-5, 1e-4);
    expect_untouched("rows_delta_rule" + what + " state", S, m0, sf, used);
}

// RoPE of each row's heads at its own position (the tolerances of test_attention's rope).
static void test_rows_rope(int nh, int D, int n_rot, int B, uint32_t ctx) {
    const auto rv = make_rows(B, B + 1, ctx, {ctx - 1, 0});
    const float theta = 1e7f;
    auto x = normals((size_t)B * nh * D);
    std::vector<double> want(x.begin(), x.end());
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < nh; ++h)
            for (int i = 0; i < n_rot / 2; ++i) {
                const double an = rv[2 * b + 1] * std::pow((double)theta, -2.0 * i / n_rot);
                const float c = (float)std::cos(an), s = (float)std::sin(an);
                double& a0 = want[((size_t)b * nh + h) * D + i];
                double& a1 = want[((size_t)b * nh + h) * D + i + n_rot / 2];
                const double x0 = a0, x1 = a1;
                a0 = x0 * c - x1 * s;
                a1 = x0 * s + x1 * c;
            }
    Buf X = Buf::of(x), R = Buf::of(rv);
    Args a = args();
    a.p[0] = X.addr();
    a.p[1] = R.addr();
    a.n[0] = nh;
    a.n[1] = D;
    a.n[2] = n_rot;
    a.f[0] = theta;
    // ops/rows.rs launches nothing without a pair to rotate.
    if (n_rot >= 2)
        emu_launch(rows_rope_neox, Dim3{(unsigned)nh, (unsigned)B, 1}, std::clamp((n_rot / 2 + 31) / 32 * 32, 32, 256), 0, a);
    expect("rows_rope_neox heads " + std::to_string(nh) + " D " + std::to_string(D) + " n_rot " + std::to_string(n_rot) +
               " B " + std::to_string(B) + " ctx " + std::to_string(ctx),
           X.get<float>(x.size()), want, 1e-5, 1e-5);
}

// k and v of each row into its slot's row pos of pools [S*ctx, W]: whole pools, bit for bit.
static void test_rows_kv_store(int W, int ctx, int B, int n_slots) {
    const auto rv = make_rows(B, n_slots, ctx, {(uint32_t)ctx - 1, 0});
    auto k = normals((size_t)B * W), v = normals((size_t)B * W);
    auto kp = normals((size_t)n_slots * ctx * W), vp = normals((size_t)n_slots * ctx * W);
    Buf K = Buf::of(k), V = Buf::of(v), KP = Buf::of(kp), VP = Buf::of(vp), R = Buf::of(rv);
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < W; ++i) {
            const size_t at = ((size_t)rv[2 * b] * ctx + rv[2 * b + 1]) * W + i;
            kp[at] = k[(size_t)b * W + i];
            vp[at] = v[(size_t)b * W + i];
        }
    Args a = args();
    a.p[0] = K.addr();
    a.p[1] = V.addr();
    a.p[2] = KP.addr();
    a.p[3] = VP.addr();
    a.p[4] = R.addr();
    a.n[0] = W;
    a.n[1] = ctx;
    emu_launch(rows_kv_store, Dim3{(unsigned)((W + 255) / 256), (unsigned)B, 1}, 256, 0, a);
    checks++;
    if (memcmp(KP.p, kp.data(), 4 * kp.size()) || memcmp(VP.p, vp.data(), 4 * vp.size())) {
        failures++;
        printf("FAIL rows_kv_store W %d ctx %d%s: pools differ\n", W, ctx, rows_tag(B, n_slots).c_str());
    }
}

// ops/rows.rs `attn_kernel`: heads per block (dividing the GQA group, HB * DL <= 32) and dims per
// lane; and which of the variants ran.
struct RowsAttnKernel {
    void (*k)(const Args);
    const char* name;
    int hb, dl;
};
static const RowsAttnKernel rows_attn_kernels[] = {
    {rows_attn_1_2, "rows_attn_1_2", 1, 2},   {rows_attn_1_4, "rows_attn_1_4", 1, 4},
    {rows_attn_1_8, "rows_attn_1_8", 1, 8},   {rows_attn_1_16, "rows_attn_1_16", 1, 16},
    {rows_attn_2_2, "rows_attn_2_2", 2, 2},   {rows_attn_2_4, "rows_attn_2_4", 2, 4},
    {rows_attn_2_8, "rows_attn_2_8", 2, 8},   {rows_attn_2_16, "rows_attn_2_16", 2, 16},
    {rows_attn_4_2, "rows_attn_4_2", 4, 2},   {rows_attn_4_4, "rows_attn_4_4", 4, 4},
    {rows_attn_4_8, "rows_attn_4_8", 4, 8},
};
static bool rows_attn_ran[std::size(rows_attn_kernels)];
static int rows_attn_pick(int H, int Hkv, int D) {
    const int dl = D <= 64 ? 2 : D <= 128 ? 4 : D <= 256 ? 8 : 16;
    const int group = H / std::max(Hkv, 1);
    int hb = 1;
    for (int c : {4, 2, 1})
        if (group % c == 0 && c * dl <= 32) {
            hb = c;
            break;
        }
    for (size_t i = 0; i < std::size(rows_attn_kernels); ++i)
        if (rows_attn_kernels[i].hb == hb && rows_attn_kernels[i].dl == dl) return (int)i;
    abort();
}

// ops/rows.rs `attn_splits`: from the SM count, the blocks of one split and the context.
static int rows_attn_splits(int sms, int blocks_per_split, int ctx) {
    const int want = std::max((8 * sms + std::max(blocks_per_split, 1) - 1) / std::max(blocks_per_split, 1), (ctx + 1023) / 1024);
    return std::clamp(std::min(want, (ctx + 63) / 64), 1, 64);
}

// Each row's query against its slot's keys 0..pos (flash-decoding in splits of a fixed chunk of
// the context, then the combine pass), rows of very different lengths: the whole context, one
// key, a chunk's worth and one more, then random lengths up to `below` (the emulation's time
// grows with the keys read). Pool rows no query may read (past a row's length, slots of no row)
// are NaN, and so is the partials' workspace, so that reading one shows.
static void test_rows_attention(int H, int Hkv, int D, int ctx, int B, int n_slots, int sms, int below = 0,
                                std::vector<uint32_t> first = {}) {
    const int ki = rows_attn_pick(H, Hkv, D);
    const RowsAttnKernel& kern = rows_attn_kernels[ki];
    rows_attn_ran[ki] = true;
    const int S = rows_attn_splits(sms, B * (H / kern.hb), ctx), chunk = (ctx + S - 1) / S;
    if (first.empty()) first = {(uint32_t)ctx - 1, 0, (uint32_t)chunk - 1, (uint32_t)std::min(chunk, ctx - 1)};
    const auto rv = make_rows(B, n_slots, below > 0 ? below : ctx, first);
    const int W = Hkv * D;
    auto q = normals((size_t)B * H * D);
    std::vector<float> kp((size_t)n_slots * ctx * W, NAN), vp((size_t)n_slots * ctx * W, NAN);
    for (int b = 0; b < B; ++b)
        for (size_t i = 0; i < (size_t)(rv[2 * b + 1] + 1) * W; ++i) {
            kp[(size_t)rv[2 * b] * ctx * W + i] = nrand();
            vp[(size_t)rv[2 * b] * ctx * W + i] = nrand();
        }
    const double scale = 1 / std::sqrt((double)D);
    std::vector<double> want((size_t)B * H * D, 0.0);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            const int n = (int)rv[2 * b + 1] + 1, kvh = h / (H / Hkv);
            const float* kb = &kp[(size_t)rv[2 * b] * ctx * W + kvh * D];
            const float* vb = &vp[(size_t)rv[2 * b] * ctx * W + kvh * D];
            const float* qh = &q[((size_t)b * H + h) * D];
            std::vector<double> sc(n);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; ++j) {
                double d = 0;
                for (int i = 0; i < D; ++i) d += (double)qh[i] * kb[(size_t)j * W + i];
                mx = std::max(mx, sc[j] = d * scale);
            }
            for (int j = 0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
            for (int j = 0; j < n; ++j)
                for (int i = 0; i < D; ++i) want[((size_t)b * H + h) * D + i] += sc[j] / sum * vb[(size_t)j * W + i];
        }
    Buf Q = Buf::of(q), KP = Buf::of(kp), VP = Buf::of(vp), O(4 * want.size()), R = Buf::of(rv);
    Buf Part(4 * (size_t)B * H * S * (D + 2));
    memset(O.p, 0xFF, O.n);
    memset(Part.p, 0xFF, Part.n);
    Args a = args();
    a.p[0] = Q.addr();
    a.p[1] = KP.addr();
    a.p[2] = VP.addr();
    a.p[3] = O.addr();
    a.p[4] = R.addr();
    a.p[5] = S > 1 ? Part.addr() : 0;
    a.n[0] = H;
    a.n[1] = Hkv;
    a.n[2] = D;
    a.n[3] = S;
    a.n[4] = ctx;
    a.n[5] = chunk;
    a.f[0] = (float)scale;
    emu_launch(kern.k, Dim3{(unsigned)(H / kern.hb), (unsigned)B, (unsigned)S}, 128, 0, a);
    if (S > 1) {
        Args c = args();
        c.p[0] = Part.addr();
        c.p[1] = O.addr();
        c.p[2] = R.addr();
        c.n[0] = H;
        c.n[1] = D;
        c.n[2] = S;
        c.n[3] = ctx;
        c.n[4] = chunk;
        emu_launch(rows_attn_combine, Dim3{(unsigned)H, (unsigned)B, 1}, 128, 0, c);
    }
    std::string lens;
    for (int b = 0; b < std::min(B, 6); ++b) lens += (b ? "," : "") + std::to_string(rv[2 * b + 1] + 1);
    expect(std::string(kern.name) + (S > 1 ? " + combine" : "") + " h " + std::to_string(H) + "/" + std::to_string(Hkv) +
               " D " + std::to_string(D) + " ctx " + std::to_string(ctx) + " S " + std::to_string(S) + " chunk " +
               std::to_string(chunk) + rows_tag(B, n_slots) + " lengths " + lens + (B > 6 ? ",..." : ""),
           O.get<float>(want.size()), want, 5e-6, 1e-4);
}

static void test_rows() {
    // Qwen3.5-9B (src/synth/shapes.rs): GDN hk 16, hv 32, dk = dv = 128 (conv_dim 8192, K 4);
    // attention 16 / 4 heads of 256, n_rot 64, ctx 262144. An H100's / H200's 132 SMs. The
    // emulation costs a context switch per thread per shuffle, so the 9B shapes run with few rows
    // (B 17 on the small shapes) and short contexts.
    const int sms = 132;
    for (int B : {1, 3, 17}) {
        if (B < 17) test_rows_conv(8192, 4, B, B + 2);
        test_rows_conv(37, 4, B, 2 * B + 1);
        test_rows_conv(300, 2, B, B + 3);  // K 2: the state is one row, nothing shifts
        test_rows_conv(5, 5, B, B + 1);
        test_rows_rope(16, 256, 64, B, 262144);
        test_rows_rope(4, 256, 64, B, 262144);
        test_rows_rope(3, 37, 36, B, 1000);
        test_rows_rope(2, 600, 600, B, 70000);  // 300 pairs: 256 threads, two passes
        test_rows_rope(2, 10, 0, B, 50);        // nothing rotated: no launch, x unchanged
        test_rows_kv_store(4 * 256, 9, B, B + 2);
        test_rows_kv_store(37, 5, B, 2 * B + 1);
        test_rows_kv_store(300, 1, B, B + 1);  // ctx 1: every row at position 0
        test_rows_delta(2, 6, 37, 9, B, B + 2);  // dv not a multiple of a block's 4 rows
        test_rows_delta(1, 2, 200, 9, B, B + 1);
        test_rows_delta(2, 2, 300, 5, B, B + 1);
    }
    test_rows_delta(16, 32, 128, 128, 1, 3);
    // Attention: 9B's heads (rows_attn_4_8) split by the context, and unsplit (ctx <= 64).
    test_rows_attention(16, 4, 256, 300, 1, 3, sms);
    test_rows_attention(16, 4, 256, 300, 3, 5, sms);
    test_rows_attention(16, 4, 256, 130, 17, 19, sms, 50);
    test_rows_attention(16, 4, 256, 50, 3, 4, sms, 0, {49, 0, 17});
    test_rows_attention(16, 4, 256, 64, 1, 2, sms, 0, {0});
    // The 64-split cap (chunk 65: the last split of a full row holds 5 keys).
    test_rows_attention(1, 1, 33, 4100, 1, 2, sms);
    // Every other variant, odd sizes (D not a multiple of 32), with and without splits.
    test_rows_attention(3, 1, 40, 200, 3, 4, sms);        // 1_2
    test_rows_attention(4, 2, 64, 130, 17, 18, sms, 40);  // 2_2
    test_rows_attention(8, 2, 33, 50, 3, 5, sms);         // 4_2
    test_rows_attention(5, 5, 100, 150, 3, 4, sms);       // 1_4
    test_rows_attention(4, 2, 128, 90, 1, 2, sms);        // 2_4
    test_rows_attention(8, 1, 65, 300, 3, 6, sms);        // 4_4
    test_rows_attention(3, 3, 200, 129, 3, 4, sms);       // 1_8
    test_rows_attention(6, 3, 130, 257, 17, 20, sms, 60); // 2_8
    test_rows_attention(3, 1, 300, 140, 3, 5, sms);       // 1_16
    test_rows_attention(8, 1, 512, 70, 3, 4, sms);        // 2_16
    test_rows_attention(2, 2, 257, 1, 1, 3, sms);         // ctx 1: 1_16, one key
    checks++;
    for (size_t i = 0; i < std::size(rows_attn_kernels); ++i)
        if (!rows_attn_ran[i]) {
            failures++;
            printf("FAIL rows: %s never ran\n", rows_attn_kernels[i].name);
        }
    checks++;
    if (!rows_delta_ran[0] || !rows_delta_ran[1] || !rows_delta_ran[2]) {
        failures++;
        printf("FAIL rows: a rows_delta_rule variant never ran\n");
    }
}

int main(int argc, char** argv) {
    // Optional filter: run only the groups whose name contains argv[1].
    const std::string only = argc > 1 ? argv[1] : "";
    auto want = [&](const char* g) { return only.empty() || std::string(g).find(only) != std::string::npos; };
    if (want("matvec")) {
        test_matvec<FmtQ4_K>("Q4_K", matvec_Q4_K, matvec_glu_Q4_K, matmul_tiled_Q4_K, embed_Q4_K, 768);
        test_matvec<FmtQ6_K>("Q6_K", matvec_Q6_K, matvec_glu_Q6_K, matmul_tiled_Q6_K, embed_Q6_K, 512);
        test_matvec<FmtQ8_0>("Q8_0", matvec_Q8_0, matvec_glu_Q8_0, matmul_tiled_Q8_0, embed_Q8_0, 96);
        test_matvec<FmtQ5_0>("Q5_0", matvec_Q5_0, matvec_glu_Q5_0, matmul_tiled_Q5_0, embed_Q5_0, 4096);
        test_matvec<FmtF32>("F32", matvec_F32, matvec_glu_F32, matmul_tiled_F32, embed_F32, 37);
        test_matvec<FmtF16>("F16", matvec_F16, matvec_glu_F16, matmul_tiled_F16, embed_F16, 100);
    }
    if (want("group")) {
        // The GDN projections' shape (qkv + z + beta + alpha, scaled down: 4096 + 8 rows), a
        // block's rows (32) and one more, one row; the F32 router + shared-expert gate pair.
        test_matvec_group<FmtQ4_K>("Q4_K", matvec_Q4_K, 256, {4104, 33, 32, 1});
        test_matvec_group<FmtQ6_K>("Q6_K", matvec_Q6_K, 512, {33, 7, 70});
        test_matvec_group<FmtQ8_0>("Q8_0", matvec_Q8_0, 96, {32, 33, 1, 65});
        test_matvec_group<FmtF32>("F32", matvec_F32, 37, {64, 1});
    }
    if (want("moe")) {
        test_moe<FmtQ4_K>("Q4_K", matvec_glu_Q4_K, matvec_Q4_K, 256, 512);
        test_moe<FmtQ8_0>("Q8_0", matvec_glu_Q8_0, matvec_Q8_0, 64, 96);
        test_moe_shared<FmtQ4_K>("Q4_K", matvec_glu_Q4_K, matvec_Q4_K, matvec_glu_sh_Q4_K, matvec_sh_Q4_K, 256, 512);
        test_moe_shared<FmtQ6_K>("Q6_K", matvec_glu_Q6_K, matvec_Q6_K, matvec_glu_sh_Q6_K, matvec_sh_Q6_K, 256, 256);
        // The 35B-A3B down shape: rows of 512 (16 units: two groups of entries on 32 lanes).
        test_moe_shared<FmtQ6_K>("Q6_K", matvec_glu_Q6_K, matvec_Q6_K, matvec_glu_sh_Q6_K, matvec_sh_Q6_K, 256, 512);
        test_moe_shared<FmtQ8_0>("Q8_0", matvec_glu_Q8_0, matvec_Q8_0, matvec_glu_sh_Q8_0, matvec_sh_Q8_0, 64, 96);
        test_moe_shared<FmtF32>("F32", matvec_glu_F32, matvec_F32, matvec_glu_sh_F32, matvec_sh_F32, 37, 45);
    }
    if (want("norm")) test_norms();
    if (want("conv")) test_conv();
    if (want("delta")) test_delta();
    if (want("gdn_step")) test_gdn_step();
    if (want("attention")) test_attention();
    if (want("attn_prep")) test_attn_prep();
    if (want("route")) test_route_argmax_elementwise();
    if (want("rows")) test_rows();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
