// pf_host.h: the GPU side of the harness's host code: CUDA error checks, event timing, logging.
#pragma once

#include <cuda_runtime.h>

#include "pf_ref.h"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
            exit(2);                                                                            \
        }                                                                                       \
    } while (0)
#define CKL() CK(cudaGetLastError())

namespace host {

// ---------------------------------------------------------------- timing
// Median time (ms) of `reps` calls of f, each bracketed by events, after `warm` calls.
template <class Fn>
static double time_ms(Fn&& f, int warm = 3, int reps = 15) {
    for (int i = 0; i < warm; i++) f();
    CK(cudaDeviceSynchronize());
    CKL();
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(ev[2 * r]));
        f();
        CK(cudaEventRecord(ev[2 * r + 1]));
    }
    CK(cudaDeviceSynchronize());
    CKL();
    std::vector<float> t(reps);
    for (int r = 0; r < reps; r++) CK(cudaEventElapsedTime(&t[r], ev[2 * r], ev[2 * r + 1]));
    for (auto& e : ev) CK(cudaEventDestroy(e));
    std::sort(t.begin(), t.end());
    return t[reps / 2];
}

// ---------------------------------------------------------------- logging
struct Log {
    FILE* f = nullptr;
    FILE* rows = nullptr;            // summary rows as they come (survive a killed run)
    std::vector<std::string> table;  // the summary printed last
    void open(const std::string& dir) {
        f = fopen((dir + "/prefill.log").c_str(), "w");
        rows = fopen((dir + "/summary.txt").c_str(), "w");
    }
    static std::string vfmt(const char* fmt, va_list ap) {
        char buf[1024];
        vsnprintf(buf, sizeof buf, fmt, ap);
        return buf;
    }
    void to_file(const std::string& s) {
        if (f) {
            fputs(s.c_str(), f);
            fputc('\n', f);
            fflush(f);
        }
    }
    // A detail line: stdout and the log file.
    void line(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        const std::string s = vfmt(fmt, ap);
        va_end(ap);
        printf("%s\n", s.c_str());
        fflush(stdout);
        to_file(s);
    }
    // A summary row: the log file now, stdout at the end.
    void row(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        const std::string s = vfmt(fmt, ap);
        va_end(ap);
        table.push_back(s);
        to_file(s);
        if (rows) {
            fprintf(rows, "%s\n", s.c_str());
            fflush(rows);
        }
    }
};

}  // namespace host
