// conv1d_causal_silu.wgsl followed by l2_norm_qk.wgsl in one workgroup (the Gated DeltaNet's conv
// and q/k normalisation; used by conv1d_silu_l2qk.wgsl, and by gdn_conv_gates.wgsl beside the
// gates). x [T, C] raw inputs, w [C, K] taps, state [K-1, C] (updated), out [T, C] with
// C = conv_dim = [q heads | k heads | v].
//
// Workgroup g < 2*hk owns q or k head g (dk <= CONV_NORM_WG channels, one per invocation);
// the remaining workgroups own CONV_NORM_WG channels of v each. Every invocation runs its
// channel's causal conv over the T tokens with a private window (as conv1d_causal_silu.wgsl); for
// a q/k head the workgroup then sums the squares of the token's head and scales by
// 1 / sqrt(sum + eps) (q also by 1/sqrt(dk)), exactly the separate ops' arithmetic.
struct Params {
    t_len: u32,
    c: u32,
    k: u32,
    hk: u32,
    dk: u32,
    eps: f32,
    q_scale: f32,
    // gdn_conv_gates.wgsl only: the conv workgroups (2*hk + the v groups), then the gates'
    // element count T * Hv and Hv.
    groups: u32,
    n_gates: u32,
    hv: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Workgroup g's channels (g uniform over the workgroup: the reduction's barriers).
fn conv_l2qk(g: u32, li: u32, lanes: Lanes) {
    let heads = 2u * P.hk;
    let is_head = g < heads; // uniform per workgroup
    var c = 0u;
    if (is_head) {
        c = g * P.dk + li;
    } else {
        c = heads * P.dk + (g - heads) * CONV_NORM_WG + li;
    }
    let own = select(c < P.c, li < P.dk, is_head);
    let km1 = P.k - 1u;
    var win: array<f32, CONV_MAX_K>;
    if (own) {
        for (var j = 0u; j < km1; j++) {
            win[j] = state[j * P.c + c];
        }
    }
    var scale = P.q_scale;
    if (g >= P.hk) {
        scale = 1.0;
    }
    for (var t = 0u; t < P.t_len; t++) {
        var y = 0.0;
        if (own) {
            let xt = x[t * P.c + c];
            var acc = 0.0;
            for (var j = 0u; j < km1; j++) {
                acc += w[c * P.k + j] * win[j];
            }
            acc += w[c * P.k + km1] * xt;
            y = silu(acc);
            for (var j = 0u; j + 1u < km1; j++) {
                win[j] = win[j + 1u];
            }
            if (km1 > 0u) {
                win[km1 - 1u] = xt;
            }
        }
        if (is_head) {
            let s = 1.0 / sqrt(wg_sum(y * y, li, CONV_NORM_WG, lanes) + P.eps);
            y = y * (s * scale);
        }
        if (own) {
            out[t * P.c + c] = y;
        }
    }
    if (own) {
        for (var j = 0u; j < km1; j++) {
            state[j * P.c + c] = win[j];
        }
    }
}
