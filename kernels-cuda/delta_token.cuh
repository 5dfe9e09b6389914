// delta_token.cuh: one token of the gated delta rule on one state row held in registers
// (spec/DELTANET.md A.2, row-owned), shared by delta_rule.cu (a sequence's tokens in turn) and
// rows.cu (one token of each row's own sequence). A warp owns the row: lane `lane` holds the
// elements lane + 32 m of M (the value-major row c of the head's state) and of q and k.
//   pred = e^g (M . k);  delta = beta (v - pred);  M = e^g M + delta k;  o = M . q
#pragma once
#include "common.cuh"

// Updates M in place and returns o (every lane gets the warp's sum).
template <int DR_MAXC>
__device__ __forceinline__ float delta_token(float (&M)[DR_MAXC], const float* q, const float* k, float v, float decay,
                                             float beta, int dk, int lane) {
    float kr[DR_MAXC], qr[DR_MAXC];
    float kv = 0.0f;
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        const int i = lane + 32 * m;
        kr[m] = i < dk ? k[i] : 0.0f;
        qr[m] = i < dk ? q[i] : 0.0f;
        kv = fmaf(M[m], kr[m], kv);
    }
    const float pred = decay * warp_sum(kv);
    const float delta = beta * (v - pred);
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < DR_MAXC; ++m) {
        M[m] = decay * M[m] + delta * kr[m];
        o = fmaf(M[m], qr[m], o);
    }
    return warp_sum(o);
}
