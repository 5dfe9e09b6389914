// dev/cuda/l2pf_bench.cu: does pulling the next product's weights into L2 from a side branch of
// the decode graph speed up a token's chain of products? (llm.c dev/cuda style: one question, one
// file, every variant checked against the first.)
//
// A qwen3.5-9b-like decode step (32 layers: prep, qkv 8192 x 4096, z 4096 x 4096, three small
// kernels standing in for conv / delta rule / gated norm, prep, out 4096 x 4096, prep, fused SwiGLU
// 2 x 12288 x 4096, prep, down 4096 x 12288), the production tensor-core kernels of Q4_K or Q8_0,
// chained under programmatic dependent launch and captured as one CUDA graph, as the backend runs
// a token. Variants add, in a second captured stream, a prefetch kernel per product that starts
// when the product may start and pulls the weights of the product(s) after it into L2:
//   none               the production chain (baseline);
//   line A cap         prefetch.global.L2 per 128-byte line, A products ahead, at most cap MB each;
//   bulk A cap         cp.async.bulk.prefetch.L2 (the TMA engine) in 64 KB pieces.
// Build twice, with and without -DMVTC_WEIGHT_EVICT_FIRST (the products' weight loads marked
// evict-first in L2), and compare. Outputs of every variant must equal the baseline's bit for bit
// (prefetching changes no arithmetic); the run prints the time per token and the products' bytes
// per second.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I kernels-cuda dev/cuda/l2pf_bench.cu -o l2pf
//   nvcc ... -DMVTC_WEIGHT_EVICT_FIRST -o l2pf_ef
//   L2PF_FMT=Q4_K ./l2pf; L2PF_FMT=Q8_0 ./l2pf
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "matvec_tc.cuh"
#include "matvec_tc8.cuh"

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                    cudaGetErrorString(e_));                                                           \
            exit(2);                                                                                   \
        }                                                                                              \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Kernels: the production bodies, a stand-in for the small kernels, the prefetchers.

template <class F, int R, int KW, bool GLU, bool DENSE>
__global__ void __launch_bounds__(32 * KW) k_mv(const Args a) {
    mvtc::mv_body<F, R, KW, GLU, DENSE>(a);
}
__global__ void __launch_bounds__(32) k_prep_q4k(const Args a) {
    mvtc::prep_x_body(mvtc::PrepArgs{reinterpret_cast<const float*>(a.p[0]), reinterpret_cast<uint32_t*>(a.p[1]),
                                     reinterpret_cast<float*>(a.p[2])});
}
__global__ void __launch_bounds__(32) k_prep_q80(const Args a) {
    mvtc8::prep_x_body(mvtc8::PrepArgs{reinterpret_cast<const float*>(a.p[0]), reinterpret_cast<uint32_t*>(a.p[1]),
                                       reinterpret_cast<float*>(a.p[2])});
}
// A small kernel of the chain (conv, delta rule, norm): 32 blocks that read a little and spin
// about `ns` nanoseconds.
__global__ void __launch_bounds__(128) k_small(float* scratch, long long ns) {
    kernel_start();
    const long long t0 = clock64();
    float v = scratch[threadIdx.x];
    while (clock64() - t0 < ns * 2) v = v * 0.999f + 1.0f;  // ~2 GHz clock
    if (v == 12345.0f) scratch[threadIdx.x] = v;
}
// Prefetchers (no dependent-launch wait: they read only weights).
__global__ void k_pf_line(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)gridDim.x * blockDim.x;
    for (size_t off = i * 128; off < na; off += n * 128) prefetch_l2(a + off);
    for (size_t off = i * 128; off < nb; off += n * 128) prefetch_l2(b + off);
}
__device__ __forceinline__ void bulk_pf(const uint8_t* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
constexpr size_t PIECE = 64 * 1024;
__global__ void k_pf_bulk(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)gridDim.x * blockDim.x;
    for (size_t off = i * PIECE; off < na; off += n * PIECE) bulk_pf(a + off, (uint32_t)min(PIECE, na - off));
    for (size_t off = i * PIECE; off < nb; off += n * PIECE) bulk_pf(b + off, (uint32_t)min(PIECE, nb - off));
}
__global__ void k_fill(uint32_t* p, size_t words, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        // keep f16 scales finite and small: clear exponent bits 14 and 30 of every word
        p[i] = h & 0xBBFFBBFFu;
    }
}

// ---------------------------------------------------------------------------------------------
// The chain.

enum OpKind { OP_PREP, OP_MV, OP_SMALL };
struct Op {
    OpKind kind;
    void (*kern)(const Args);
    dim3 grid;
    int threads;
    Args a;
    const uint8_t* w[2];  // weights (products)
    size_t wbytes;        // bytes of each weight matrix
};

struct Fmt {
    const char* name;
    int words, sums;                 // prepared x per 256 inputs
    size_t (*row_bytes)(int n_in);
    void (*prep)(const Args);
    void (*tall)(const Args);
    int tall_rows, tall_threads;
    void (*mv)(const Args);
    void (*glu)(const Args);
};
static size_t rb_q4k(int n) { return (size_t)n / 256 * 144; }
static size_t rb_q80(int n) { return (size_t)n / 32 * 34; }
static const Fmt FMTS[] = {
    {"Q4_K", mvtc::SB_WORDS, mvtc::SB_SUMS, rb_q4k, k_prep_q4k, k_mv<mvtc::TcQ4K, 2, 4, false, false>, 32, 128,
     k_mv<mvtc::TcQ4K, 1, 8, false, false>, k_mv<mvtc::TcQ4K, 1, 8, true, false>},
    {"Q8_0", mvtc8::G_WORDS, mvtc8::G_FACT, rb_q80, k_prep_q80, k_mv<mvtc8::TcQ80, 2, 8, false, true>, 32, 256,
     k_mv<mvtc8::TcQ80, 1, 8, false, false>, k_mv<mvtc8::TcQ80, 1, 8, true, false>},
};

static uint8_t* dev_weights(size_t bytes, uint32_t seed) {
    uint8_t* p;
    CK(cudaMalloc(&p, bytes));
    k_fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(p), bytes / 4, seed);
    CK(cudaGetLastError());
    return p;
}

int main() {
    const char* fname = getenv("L2PF_FMT") ? getenv("L2PF_FMT") : "Q4_K";
    const Fmt* f = nullptr;
    for (const Fmt& c : FMTS)
        if (strcmp(c.name, fname) == 0) f = &c;
    if (!f) {
        fprintf(stderr, "L2PF_FMT: Q4_K or Q8_0\n");
        return 2;
    }
    const int layers = getenv("L2PF_LAYERS") ? atoi(getenv("L2PF_LAYERS")) : 32;
    const long long small_ns = getenv("L2PF_SMALL_NS") ? atoll(getenv("L2PF_SMALL_NS")) : 3000;
    const int E = 4096, FF = 12288;
#ifdef MVTC_WEIGHT_EVICT_FIRST
    printf("weight loads: L2 evict_first\n");
#else
    printf("weight loads: plain\n");
#endif
    // x (f32), prepared copies, outputs.
    float *x4, *x12, *scratch;
    uint32_t *xa4, *xa12;
    float *xs4, *xs12;
    CK(cudaMalloc(&x4, E * 4));
    CK(cudaMalloc(&x12, FF * 4));
    CK(cudaMalloc(&scratch, 4096));
    CK(cudaMalloc(&xa4, (size_t)E / 256 * f->words * 4));
    CK(cudaMalloc(&xs4, (size_t)E / 256 * f->sums * 4));
    CK(cudaMalloc(&xa12, (size_t)FF / 256 * f->words * 4));
    CK(cudaMalloc(&xs12, (size_t)FF / 256 * f->sums * 4));
    {
        std::vector<float> h(FF);
        for (int i = 0; i < FF; i++) h[i] = sinf(0.37f * i) * (1.0f + (i % 7));
        CK(cudaMemcpy(x4, h.data(), E * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x12, h.data(), FF * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(scratch, 0, 4096));
    }
    float* outs;  // every product its own output
    const size_t out_floats_per_layer = 8192 + 4096 + 4096 + FF + 4096;
    CK(cudaMalloc(&outs, out_floats_per_layer * layers * 4));

    std::vector<Op> ops;
    size_t total_bytes = 0;
    auto prep = [&](bool wide) {
        Op o{};
        o.kind = OP_PREP;
        o.kern = f->prep;
        o.grid = dim3((wide ? FF : E) / 256);
        o.threads = 32;
        o.a.p[0] = (unsigned long long)(wide ? x12 : x4);
        o.a.p[1] = (unsigned long long)(wide ? xa12 : xa4);
        o.a.p[2] = (unsigned long long)(wide ? xs12 : xs4);
        ops.push_back(o);
    };
    auto small = [&]() {
        Op o{};
        o.kind = OP_SMALL;
        ops.push_back(o);
    };
    uint32_t seed = 1;
    float* out = outs;
    auto mv = [&](int rows, int n_in, bool glu) {
        Op o{};
        o.kind = OP_MV;
        const size_t rb = f->row_bytes(n_in);
        o.wbytes = rb * rows;
        o.w[0] = dev_weights(o.wbytes, seed++);
        o.w[1] = glu ? dev_weights(o.wbytes, seed++) : nullptr;
        total_bytes += o.wbytes * (glu ? 2 : 1);
        const bool tall = !glu && rows >= 8192;
        o.kern = glu ? f->glu : tall ? f->tall : f->mv;
        o.threads = tall ? f->tall_threads : 256;
        const int rpb = tall ? f->tall_rows : 16;
        o.grid = dim3((rows + rpb - 1) / rpb, 1);
        o.a.seg[0] = MvSeg{(unsigned long long)o.w[0], (unsigned long long)out, rows, 0};
        o.a.p[1] = (unsigned long long)o.w[1];
        o.a.p[2] = (unsigned long long)(n_in == E ? xa4 : xa12);
        o.a.p[6] = (unsigned long long)(n_in == E ? xs4 : xs12);
        o.a.n[1] = n_in;
        o.a.n[2] = (long long)rb;
        o.a.n[5] = 1;
        o.a.n[6] = 1;
        out += rows;
        ops.push_back(o);
    };
    for (int l = 0; l < layers; l++) {
        prep(false);
        mv(8192, E, false);  // qkv
        mv(4096, E, false);  // z
        small();
        small();
        small();
        prep(false);
        mv(4096, E, false);  // out
        prep(false);
        mv(FF, E, true);  // gate, up
        prep(true);
        mv(E, FF, false);  // down
    }
    CK(cudaDeviceSynchronize());
    printf("format %s, %d layers, %zu products, %.1f MB of weights per token\n", f->name, layers,
           (size_t)std::count_if(ops.begin(), ops.end(), [](const Op& o) { return o.kind == OP_MV; }),
           total_bytes / 1e6);
    // The products in order (for "the next A products").
    std::vector<int> mv_idx;
    for (int i = 0; i < (int)ops.size(); i++)
        if (ops[i].kind == OP_MV) mv_idx.push_back(i);

    cudaStream_t st, side;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> evs(ops.size() + 1);
    for (auto& e : evs) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    auto launch = [&](void (*k)(const Args), dim3 g, int threads, const Args& a, cudaStream_t s, bool pdl) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = g;
        cfg.blockDim = dim3(threads);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = pdl ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, k, a));
    };
    auto launch_small = [&](cudaStream_t s) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(32);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, k_small, scratch, small_ns));
    };

    struct Variant {
        std::string name;
        int mode;  // 0 none, 1 line, 2 bulk
        int ahead;
        size_t cap;
        int blocks, threads;
    };
    std::vector<Variant> vars = {
        {"none", 0, 0, 0, 0, 0},
        {"line 1 24MB g132x128", 1, 1, 24 << 20, 132, 128},
        {"line 1 48MB g132x128", 1, 1, 48 << 20, 132, 128},
        {"line 1 24MB g264x256", 1, 1, 24 << 20, 264, 256},
        {"line 2 16MB g132x128", 1, 2, 16 << 20, 132, 128},
        {"bulk 1 24MB g16x32", 2, 1, 24 << 20, 16, 32},
        {"bulk 1 48MB g16x32", 2, 1, 48 << 20, 16, 32},
        {"bulk 1 24MB g132x32", 2, 1, 24 << 20, 132, 32},
        {"bulk 2 16MB g16x32", 2, 2, 16 << 20, 16, 32},
        {"bulk 1 8MB g16x32", 2, 1, 8 << 20, 16, 32},
    };
    if (getenv("L2PF_ONLY")) {
        std::vector<Variant> keep;
        for (auto& v : vars)
            if (v.name == "none" || strstr(v.name.c_str(), getenv("L2PF_ONLY"))) keep.push_back(v);
        vars = keep;
    }
    std::vector<float> ref(out_floats_per_layer * layers), got(ref.size());
    const int reps = getenv("L2PF_REPS") ? atoi(getenv("L2PF_REPS")) : 20;
    int fails = 0;
    double base_us = 0;
    for (int round = 0; round < 2; round++)
        for (const Variant& v : vars) {
            CK(cudaMemset(outs, 0, ref.size() * 4));
            cudaGraph_t graph;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            bool forked = false;
            int mvn = 0;
            for (size_t i = 0; i < ops.size(); i++) {
                const Op& o = ops[i];
                if (o.kind == OP_MV && v.mode != 0) {
                    // The prefetch of the next products starts when this product may start.
                    CK(cudaEventRecord(evs[i], st));
                    CK(cudaStreamWaitEvent(side, evs[i], 0));
                    forked = true;
                    const uint8_t* pa = nullptr;
                    const uint8_t* pb = nullptr;
                    size_t na = 0, nb = 0;
                    for (int k = 1; k <= v.ahead && mvn + k < (int)mv_idx.size(); k++) {
                        const Op& nx = ops[mv_idx[mvn + k]];
                        const size_t each = std::min(nx.wbytes, nx.w[1] ? v.cap / 2 : v.cap);
                        if (k == 1) {
                            pa = nx.w[0], na = each;
                            if (nx.w[1]) pb = nx.w[1], nb = each;
                        } else if (!pb) {
                            pb = nx.w[0], nb = each;
                        }
                    }
                    if (na > 0) {
                        if (v.mode == 1)
                            k_pf_line<<<v.blocks, v.threads, 0, side>>>(pa, na, pb, nb);
                        else
                            k_pf_bulk<<<v.blocks, v.threads, 0, side>>>(pa, na, pb, nb);
                        CK(cudaGetLastError());
                    }
                }
                if (o.kind == OP_SMALL)
                    launch_small(st);
                else
                    launch(o.kern, o.grid, o.threads, o.a, st, true);
                if (o.kind == OP_MV) mvn++;
            }
            if (forked) {
                CK(cudaEventRecord(evs[ops.size()], side));
                CK(cudaStreamWaitEvent(st, evs[ops.size()], 0));
            }
            CK(cudaStreamEndCapture(st, &graph));
            cudaGraphExec_t exec;
            CK(cudaGraphInstantiate(&exec, graph, 0));
            for (int w = 0; w < 3; w++) CK(cudaGraphLaunch(exec, st));
            CK(cudaStreamSynchronize(st));
            cudaEvent_t t0, t1;
            CK(cudaEventCreate(&t0));
            CK(cudaEventCreate(&t1));
            CK(cudaEventRecord(t0, st));
            for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(exec, st));
            CK(cudaEventRecord(t1, st));
            CK(cudaEventSynchronize(t1));
            float ms;
            CK(cudaEventElapsedTime(&ms, t0, t1));
            const double us = ms * 1000.0 / reps;
            CK(cudaMemcpy(got.data(), outs, got.size() * 4, cudaMemcpyDeviceToHost));
            bool same = true;
            if (v.mode == 0 && round == 0) {
                ref = got;
                base_us = us;
            } else {
                same = memcmp(ref.data(), got.data(), ref.size() * 4) == 0;
            }
            if (!same) fails++;
            printf("round %d  %-24s %8.1f us per token  %6.0f GB/s of weights  %+6.1f%%  %s\n", round, v.name.c_str(),
                   us, total_bytes / us / 1e3, 100.0 * (base_us / us - 1.0), same ? "same outputs" : "OUTPUTS DIFFER");
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            CK(cudaEventDestroy(t0));
            CK(cudaEventDestroy(t1));
        }
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
