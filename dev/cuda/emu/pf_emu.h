// pf_emu.h: a small CPU emulator of the CUDA execution model, enough to run the prefill kernels
// of kernels-cuda/ unchanged (compiled as host C++ with -DPF_EMU) on a machine without a GPU.
//
// Every CUDA thread is a coroutine on its own stack (x86-64 context switch below); one OS thread
// runs a block's threads round-robin, each until it reaches a synchronisation point:
//   * __syncthreads: a block barrier over the threads that have not exited;
//   * warp collectives (ldmatrix, mma.sync, shuffles, ballot): every lane deposits its operands,
//     a warp barrier, each lane computes its own result from all lanes' operands per the PTX
//     fragment layouts, a second warp barrier;
//   * cp.async: in mode EARLY a copy lands when it is issued (exposes a copy that overwrites data
//     still being read), in mode LATE only when the issuing thread's cp.async.wait_group retires
//     its group (exposes a read before the data is guaranteed to have landed).
// Shared memory starts as 0xff bytes (NaN), so a read of never-written shared memory poisons the
// output. Built with AddressSanitizer, out-of-bounds reads of global or shared memory abort.
// Blocks run one after another, so `__shared__` variables become function statics.
// A deadlock (a barrier that can never complete) aborts with a message.
#pragma once

#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PF_EMU_ASAN 1
#else
#define PF_EMU_ASAN 0
#endif

#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

using std::max;
using std::min;

extern "C" void pf_emu_switch(void** save_sp, void* load_sp);
// Save the callee-saved registers on the current stack, store the stack pointer, load the other
// one, restore its registers, return into it.
asm(R"(
.text
.globl pf_emu_switch
.type pf_emu_switch,@function
pf_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size pf_emu_switch,.-pf_emu_switch
)");

namespace pf_emu {

enum CopyMode { EARLY, LATE };

struct Copy {
    void* dst;
    const void* src;
    int bytes;
};

struct Thread {
    void* sp = nullptr;
    uint8_t* stack = nullptr;
    size_t stack_size = 0;
    uint3 tid{};
    int lane = 0, warp = 0;
    bool done = false;
    std::vector<Copy> open;               // issued, not yet committed
    std::deque<std::vector<Copy>> groups;  // committed, not yet retired (mode LATE)
};

struct Warp {
    int count = 0;
    uint64_t gen = 0;
    const void* addr[32];
    uint32_t a[32][4], b[32][2], v[32];
};

struct State {
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    Thread* cur = nullptr;
    void* sched_sp = nullptr;
    const void* main_bottom = nullptr;
    size_t main_size = 0;
    int live = 0;
    int bar_count = 0;
    uint64_t bar_gen = 0;
    uint64_t progress = 0;
    uint8_t* smem = nullptr;
    size_t smem_size = 0;
    uint3 block{}, block_dim{}, grid_dim{};
    CopyMode mode = EARLY;
    std::function<void()> body;
    long long copies = 0, collectives = 0;
};
inline State g;

inline void fail(const char* what) {
    fprintf(stderr, "pf_emu: %s (block %u,%u,%u thread %u)\n", what, g.block.x, g.block.y, g.block.z,
            g.cur ? g.cur->tid.x : 0u);
    abort();
}

// ---------------------------------------------------------------- coroutines
inline void to_scheduler() {
    Thread* t = g.cur;
#if PF_EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, g.main_bottom, g.main_size);
#endif
    pf_emu_switch(&t->sp, g.sched_sp);
#if PF_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}
inline void trampoline() {
#if PF_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g.main_bottom, &g.main_size);
#endif
    g.body();
    Thread* t = g.cur;
    if (!t->open.empty() || !t->groups.empty()) fail("thread exited with cp.async copies in flight");
    t->done = true;
    g.live--;
    g.progress++;
    for (;;) to_scheduler();  // never resumed
}
inline void start(Thread& t) {
#if PF_EMU_ASAN
    __asan_unpoison_memory_region(t.stack, t.stack_size);
#endif
    uintptr_t top = (reinterpret_cast<uintptr_t>(t.stack) + t.stack_size) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                               // fake return address of trampoline
    *--sp = reinterpret_cast<uint64_t>(&trampoline);         // where `ret` goes
    for (int i = 0; i < 6; i++) *--sp = 0;                  // rbp rbx r12 r13 r14 r15
    t.sp = sp;
}
inline void resume(Thread& t) {
    g.cur = &t;
#if PF_EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, t.stack, t.stack_size);
#endif
    pf_emu_switch(&g.sched_sp, t.sp);
#if PF_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    g.cur = nullptr;
}

// ---------------------------------------------------------------- barriers
inline void syncthreads() {
    const uint64_t gen = g.bar_gen;
    g.progress++;
    if (++g.bar_count == g.live) {
        g.bar_count = 0;
        g.bar_gen++;
        return;
    }
    while (g.bar_gen == gen) to_scheduler();
}
inline Warp& my_warp() { return g.warps[g.cur->warp]; }
inline void warp_barrier() {
    Warp& w = my_warp();
    const uint64_t gen = w.gen;
    g.progress++;
    if (++w.count == 32) {
        w.count = 0;
        w.gen++;
        return;
    }
    while (w.gen == gen) to_scheduler();
}

// ---------------------------------------------------------------- launch
// Runs `body` for every thread of every block of `grid` (x fastest), one block at a time.
inline void launch(dim3 grid, dim3 block, size_t smem, CopyMode mode, const std::function<void()>& body) {
    const int nth = static_cast<int>(block.x * block.y * block.z);
    if (nth % 32 != 0) fail("block size must be a multiple of 32");
    if (g.threads.size() != static_cast<size_t>(nth)) {
        for (auto& t : g.threads) free(t.stack);
        g.threads.assign(nth, Thread{});
        for (auto& t : g.threads) {
            t.stack_size = 256 * 1024;
            t.stack = static_cast<uint8_t*>(malloc(t.stack_size));
        }
    }
    g.warps.assign(nth / 32, Warp{});
    g.block_dim = block;
    g.grid_dim = grid;
    g.mode = mode;
    g.body = body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                g.block = make_uint3(bx, by, bz);
                g.smem_size = smem;
                g.smem = static_cast<uint8_t*>(malloc(smem ? smem : 1));
                memset(g.smem, 0xff, smem);
                g.live = nth;
                g.bar_count = 0;
                for (int i = 0; i < nth; i++) {
                    Thread& t = g.threads[i];
                    t.tid = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
                    t.lane = i % 32;
                    t.warp = i / 32;
                    t.done = false;
                    t.open.clear();
                    t.groups.clear();
                    start(t);
                }
                for (auto& w : g.warps) w.count = 0;
                while (g.live > 0) {
                    const uint64_t before = g.progress;
                    for (auto& t : g.threads)
                        if (!t.done) resume(t);
                    if (g.live > 0 && g.progress == before) fail("deadlock: no thread can make progress");
                }
                free(g.smem);
                g.smem = nullptr;
            }
}

// ---------------------------------------------------------------- memory ops
inline uint8_t* dyn_smem() { return g.smem; }
inline void check_smem(const void* p, size_t n, size_t align, const char* what) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    if (b < g.smem || b + n > g.smem + g.smem_size) fail(what);
    if (reinterpret_cast<uintptr_t>(b) % align) fail("misaligned shared memory access");
}
inline void do_copy(const Copy& c) {
    if (c.bytes) memcpy(c.dst, c.src, 16);
    else memset(c.dst, 0, 16);
}
inline void cp_async16(void* dst, const void* src, int bytes) {
    check_smem(dst, 16, 16, "cp.async destination outside shared memory");
    if (bytes != 0 && bytes != 16) fail("cp.async src-size must be 0 or 16 here");
    if (bytes && reinterpret_cast<uintptr_t>(src) % 16) fail("cp.async source not 16-byte aligned");
    g.copies++;
    const Copy c{dst, src, bytes};
    if (g.mode == EARLY) do_copy(c);
    else g.cur->open.push_back(c);
}
inline void cp_async_commit() {
    if (g.mode == LATE) {
        g.cur->groups.push_back(std::move(g.cur->open));
        g.cur->open.clear();
    }
}
inline void cp_async_wait(int n) {
    auto& q = g.cur->groups;
    while (static_cast<int>(q.size()) > n) {
        for (const Copy& c : q.front()) do_copy(c);
        q.pop_front();
    }
}

// ---------------------------------------------------------------- warp collectives
inline uint16_t ld16(const void* p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
inline void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p, bool trans) {
    Warp& w = my_warp();
    const int lane = g.cur->lane;
    check_smem(p, 16, 16, "ldmatrix row outside shared memory");
    w.addr[lane] = p;
    warp_barrier();
    uint32_t r[4];
    for (int j = 0; j < 4; j++) {
        if (!trans) {
            memcpy(&r[j], static_cast<const uint8_t*>(w.addr[8 * j + lane / 4]) + 4 * (lane % 4), 4);
        } else {
            const uint8_t* row0 = static_cast<const uint8_t*>(w.addr[8 * j + 2 * (lane % 4)]);
            const uint8_t* row1 = static_cast<const uint8_t*>(w.addr[8 * j + 2 * (lane % 4) + 1]);
            r[j] = ld16(row0 + 2 * (lane / 4)) | (static_cast<uint32_t>(ld16(row1 + 2 * (lane / 4))) << 16);
        }
    }
    g.collectives++;
    warp_barrier();
    r0 = r[0];
    r1 = r[1];
    r2 = r[2];
    r3 = r[3];
}
inline float half_bits(uint32_t v) {
    __half_raw h;
    h.x = static_cast<unsigned short>(v);
    return __half2float(__half(h));
}
inline float f32_bits(uint32_t v) {
    float f;
    memcpy(&f, &v, 4);
    return f;
}
// D = A B + C for this lane's four outputs, products and sums in f64 (the hardware adds exact
// products with wider internal precision; f64 is at least as good).
inline void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
    Warp& w = my_warp();
    const int lane = g.cur->lane;
    memcpy(w.a[lane], a, 16);
    memcpy(w.b[lane], b, 8);
    warp_barrier();
    auto A = [&](int r, int k) {
        const uint32_t v = w.a[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)];
        return half_bits(k % 2 ? v >> 16 : v & 0xffff);
    };
    auto B = [&](int k, int n) {
        const uint32_t v = w.b[n * 4 + (k % 8) / 2][k >= 8];
        return half_bits(k % 2 ? v >> 16 : v & 0xffff);
    };
    const int gq = lane / 4, t = lane % 4;
    float d[4];
    for (int e = 0; e < 4; e++) {
        const int r = gq + 8 * (e >> 1), n = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < 16; k++) s += static_cast<double>(A(r, k)) * B(k, n);
        d[e] = static_cast<float>(s);
    }
    g.collectives++;
    warp_barrier();
    memcpy(c, d, 16);
}
// D = A B + C, m16n8k32, s8 x s8 -> s32 (row.col): lane (g, t) holds A rows g (a0, a2) and g+8
// (a1, a3) at k = 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3), byte i = k % 4; B column g at the same
// k (b0, b1). The sums are exact integers; an accumulator that leaves the int32 range aborts (the
// hardware would wrap: the design must bound every sum).
inline void mma_s8(int32_t* d_out, const int32_t* c_in, const uint32_t* a, const uint32_t* b) {
    Warp& w = my_warp();
    const int lane = g.cur->lane;
    memcpy(w.a[lane], a, 16);
    memcpy(w.b[lane], b, 8);
    warp_barrier();
    auto A = [&](int r, int k) {
        const uint32_t v = w.a[(r % 8) * 4 + (k % 16) / 4][(r >= 8) + 2 * (k >= 16)];
        return static_cast<int>(static_cast<int8_t>(v >> (8 * (k % 4))));
    };
    auto B = [&](int k, int n) {
        const uint32_t v = w.b[n * 4 + (k % 16) / 4][k >= 16];
        return static_cast<int>(static_cast<int8_t>(v >> (8 * (k % 4))));
    };
    const int gq = lane / 4, t = lane % 4;
    int32_t d[4];
    for (int e = 0; e < 4; e++) {
        const int r = gq + 8 * (e >> 1), n = 2 * t + (e & 1);
        long long s = c_in[e];
        for (int k = 0; k < 32; k++) s += static_cast<long long>(A(r, k)) * B(k, n);
        if (s < INT32_MIN || s > INT32_MAX) fail("mma s8: int32 accumulator overflow");
        d[e] = static_cast<int32_t>(s);
    }
    g.collectives++;
    warp_barrier();
    memcpy(d_out, d, 16);
}
inline void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
    Warp& w = my_warp();
    const int lane = g.cur->lane;
    for (int i = 0; i < 4; i++)
        if (a[i] & 0x1fffu) fail("mma tf32 operand A not rounded to tf32");
    for (int i = 0; i < 2; i++)
        if (b[i] & 0x1fffu) fail("mma tf32 operand B not rounded to tf32");
    memcpy(w.a[lane], a, 16);
    memcpy(w.b[lane], b, 8);
    warp_barrier();
    auto A = [&](int r, int k) { return f32_bits(w.a[(r % 8) * 4 + k % 4][(r >= 8) + 2 * (k >= 4)]); };
    auto B = [&](int k, int n) { return f32_bits(w.b[n * 4 + k % 4][k >= 4]); };
    const int gq = lane / 4, t = lane % 4;
    float d[4];
    for (int e = 0; e < 4; e++) {
        const int r = gq + 8 * (e >> 1), n = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < 8; k++) s += static_cast<double>(A(r, k)) * B(k, n);
        d[e] = static_cast<float>(s);
    }
    g.collectives++;
    warp_barrier();
    memcpy(c, d, 16);
}
// cvt.rna.tf32.f32: round to the nearest tf32 (10 mantissa bits), ties away from zero.
inline uint32_t to_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf, nan
    return (u + 0x1000u) & 0xffffe000u;
}
inline uint32_t exchange(uint32_t v, int src_lane) {
    Warp& w = my_warp();
    const int lane = g.cur->lane;
    w.v[lane] = v;
    warp_barrier();
    const uint32_t r = w.v[src_lane];
    warp_barrier();
    return r;
}

// Host buffers standing in for device memory: exact size rounded up to 16 bytes (what the backend
// must allocate), filled with 0xff, so that AddressSanitizer flags any read past that.
template <class T>
static T* dev_alloc(size_t n) {
    const size_t bytes = (n * sizeof(T) + 15) / 16 * 16, cap = (bytes + 255) / 256 * 256;
    void* p = aligned_alloc(256, cap);
    memset(p, 0xff, bytes);
#if PF_EMU_ASAN
    __asan_poison_memory_region(static_cast<uint8_t*>(p) + bytes, cap - bytes);
#endif
    return static_cast<T*>(p);
}
template <class T>
static void dev_free(T* p) {
    free(p);
}

}  // namespace pf_emu

// ---------------------------------------------------------------- CUDA names
#define threadIdx (::pf_emu::g.cur->tid)
#define blockIdx (::pf_emu::g.block)
#define blockDim (::pf_emu::g.block_dim)
#define gridDim (::pf_emu::g.grid_dim)

inline void __syncthreads() { ::pf_emu::syncthreads(); }
// All 32 lanes of the warp meet (a warp barrier; the kernels here call it with the full mask).
inline void __syncwarp(unsigned = 0xffffffffu) { ::pf_emu::warp_barrier(); }
inline float __expf(float x) { return expf(x); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int atomicAdd(int* p, int v) {
    const int o = *p;
    *p = o + v;
    return o;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    const unsigned o = *p;
    *p = o > v ? o : v;
    return o;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
    using namespace pf_emu;
    Warp& w = my_warp();
    w.v[g.cur->lane] = pred ? 1u : 0u;
    warp_barrier();
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= w.v[i] << i;
    warp_barrier();
    return m;
}
inline uint32_t pf_emu_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
    return ::pf_emu::f32_bits(::pf_emu::exchange(pf_emu_bits(v), ::pf_emu::g.cur->lane ^ m));
}
inline int __shfl_xor_sync(unsigned, int v, int m) {
    return static_cast<int>(::pf_emu::exchange(static_cast<uint32_t>(v), ::pf_emu::g.cur->lane ^ m));
}
inline float __shfl_up_sync(unsigned, float v, int d) {
    const int l = ::pf_emu::g.cur->lane;
    return ::pf_emu::f32_bits(::pf_emu::exchange(pf_emu_bits(v), l >= d ? l - d : l));
}
inline int __shfl_up_sync(unsigned, int v, int d) {
    const int l = ::pf_emu::g.cur->lane;
    return static_cast<int>(::pf_emu::exchange(static_cast<uint32_t>(v), l >= d ? l - d : l));
}
inline double __shfl_up_sync(unsigned, double v, int d) {
    const int l = ::pf_emu::g.cur->lane, src = l >= d ? l - d : l;
    uint64_t u;
    memcpy(&u, &v, 8);
    const uint64_t lo = ::pf_emu::exchange(static_cast<uint32_t>(u), src);
    const uint64_t hi = ::pf_emu::exchange(static_cast<uint32_t>(u >> 32), src);
    u = lo | (hi << 32);
    memcpy(&v, &u, 8);
    return v;
}
