// Causal depthwise conv1d + SiLU over T tokens with a rolling state (spec/MODEL.md §5.3).
// x [T, C] raw inputs, w [C, K] taps (tap K-1 multiplies the newest token), state [K-1, C]
// (oldest first) the raw inputs of the previous K-1 tokens, out [T, C].
//
// One invocation per channel walks the tokens in order with the last K-1 inputs in a private
// window: out[t] = silu(sum_j w[j] * X[t + j]) with X = concat(state, x). Channels are
// independent, so the same invocation then writes its window back as the new state: the last
// K-1 rows of X, which still contain old state rows when T < K-1. Neighbouring invocations touch
// neighbouring channels, so every load and store of a token row is coalesced.

struct Params {
    t_len: u32,
    c: u32,
    k: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(CONV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let c = linear_wg(wg, nwg) * CONV_WG + li;
    if (c >= P.c) {
        return;
    }
    let km1 = P.k - 1u;
    // win[j] = X[t + j] for the current token t, j < K-1 (oldest first).
    var win: array<f32, CONV_MAX_K>;
    for (var j = 0u; j < km1; j++) {
        win[j] = state[j * P.c + c];
    }
    for (var t = 0u; t < P.t_len; t++) {
        let xt = x[t * P.c + c];
        // Sum the taps in the CPU backend's order (oldest first, newest last).
        var acc = 0.0;
        for (var j = 0u; j < km1; j++) {
            acc += w[c * P.k + j] * win[j];
        }
        acc += w[c * P.k + km1] * xt;
        out[t * P.c + c] = silu(acc);
        // Slide the window by one token.
        for (var j = 0u; j + 1u < km1; j++) {
            win[j] = win[j + 1u];
        }
        if (km1 > 0u) {
            win[km1 - 1u] = xt;
        }
    }
    for (var j = 0u; j < km1; j++) {
        state[j * P.c + c] = win[j];
    }
}
