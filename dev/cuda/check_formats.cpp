// check_formats.cpp: kernels-cuda/formats.cuh compiled for the CPU (host_shim.h) and checked against
// ggml's own dequantization of the stored blocks in tests/fixtures/quants.gguf
// (quants.reference.safetensors, deq.<TYPE>): every decoded value must be bit-identical, and every
// unit's factored dot product within 1e-6 of sum |y x|. Run through dev/cuda/check_formats.sh.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "formats.cuh"

struct Case {
    std::string name;
    uint32_t rows, cols;
    std::vector<uint8_t> bytes;
    std::vector<float> deq;
};

static bool read_cases(const char* path, std::vector<Case>& out) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    for (;;) {
        uint32_t n;
        if (fread(&n, 4, 1, f) != 1) break;
        Case c;
        c.name.resize(n);
        uint64_t nb;
        if (fread(&c.name[0], 1, n, f) != n || fread(&c.rows, 4, 1, f) != 1 || fread(&c.cols, 4, 1, f) != 1 ||
            fread(&nb, 8, 1, f) != 1)
            return false;
        c.bytes.resize(nb);
        c.deq.resize((size_t)c.rows * c.cols);
        if (fread(c.bytes.data(), 1, nb, f) != nb || fread(c.deq.data(), 4, c.deq.size(), f) != c.deq.size()) return false;
        out.push_back(std::move(c));
    }
    fclose(f);
    return true;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rnd() {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)(((rng * 0x2545F4914F6CDD1Dull) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

template <class F>
static int check(const Case& c) {
    const size_t row_bytes = c.bytes.size() / c.rows;
    // 256-byte aligned copy with zero padding (as the GPU buffers): window loads read past a block.
    const size_t padded = (c.bytes.size() + 64 + 255) / 256 * 256;
    uint8_t* buf = static_cast<uint8_t*>(aligned_alloc(256, padded));
    memset(buf, 0, padded);
    memcpy(buf, c.bytes.data(), c.bytes.size());
    int bad_values = 0, bad_dots = 0;
    double worst_dot = 0;
    const int units = (int)((c.cols + 31) / 32);
    for (uint32_t r = 0; r < c.rows; ++r) {
        const uint8_t* row = buf + r * row_bytes;
        for (int k = 0; k < units; ++k) {
            float y[32];
            dec_unit<F>(row, k, (int)c.cols, y);
            float x[32];
            float2 sx = make_float2(0, 0);
            double want = 0, mag = 0;
            for (int i = 0; i < 32; ++i) {
                const size_t e = (size_t)32 * k + i;
                x[i] = e < c.cols ? rnd() : 0.0f;
                (i < 16 ? sx.x : sx.y) += x[i];
                if (e >= c.cols) continue;
                const float d = c.deq[r * c.cols + e];
                if (__float_as_uint(y[i]) != __float_as_uint(d) && !(y[i] == 0 && d == 0)) {
                    if (bad_values < 5)
                        fprintf(stderr, "%s row %u elem %zu: decoded %.9g (0x%08x), ggml %.9g (0x%08x)\n", c.name.c_str(), r,
                                e, y[i], __float_as_uint(y[i]), d, __float_as_uint(d));
                    bad_values++;
                }
                want += (double)d * x[i];
                mag += std::fabs((double)d * x[i]);
            }
            const float got = dot_unit<F>(row, k, (int)c.cols, x, sx);
            const double err = std::fabs(got - want) / (mag > 0 ? mag : 1.0);
            if (err > worst_dot) worst_dot = err;
            if (!(err <= 1e-6)) {
                if (bad_dots < 5)
                    fprintf(stderr, "%s row %u unit %d: dot %.9g, reference %.9g (error %.2e of sum |y x|)\n", c.name.c_str(), r,
                            k, got, want, err);
                bad_dots++;
            }
        }
    }
    free(buf);
    printf("%-7s %u x %-5u values %s, dots %s (worst %.2e of sum |y x|)\n", c.name.c_str(), c.rows, c.cols,
           bad_values ? "DIFFER" : "bit-identical", bad_dots ? "FAIL" : "ok", worst_dot);
    return bad_values + bad_dots;
}

int main(int argc, char** argv) {
    std::vector<Case> cases;
    if (argc < 2 || !read_cases(argv[1], cases)) {
        fprintf(stderr, "usage: check_formats VECTORS (written by dev/cuda/check_formats.sh)\n");
        return 2;
    }
    int failures = 0, seen = 0;
    for (const Case& c : cases) {
        seen++;
#define CHECK(TYPE, F) \
    if (c.name == #TYPE) failures += check<F>(c);
        FOR_EACH_FORMAT(CHECK)
#undef CHECK
    }
    printf("%d formats checked, %s\n", seen, failures ? "FAILED" : "all match ggml");
    return failures ? 1 : 0;
}
