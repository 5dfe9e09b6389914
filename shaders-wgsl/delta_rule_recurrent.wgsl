// Gated delta rule, token by token (spec/DELTANET.md A.2/A.3), on the value-major state
// M [Hv, dv, dk] (row c = value index, contiguous over the key index i).
//
// Row-owned without subgroups: one workgroup per (value head j, block of DELTA_ROWS state rows), one
// invocation per row c. The invocation keeps its whole row M[c][0..dk] in a private array for
// all T tokens and writes it back once at the end. Per token, the workgroup stages k and q in
// workgroup memory (every row needs all of them) and each invocation does, on its own row only:
//   m     = e^g · (M_c · k)                 (prediction from the decayed row)
//   δ     = β · (v[c] − m)
//   M_c   = e^g · M_c + δ · k
//   o[c]  = M_c · q                         (with the updated row)
// No reduction ever runs over a column of M, so the transposed-state bug (A.4) cannot occur.
// The host splits long sequences into several dispatches of at most a few hundred tokens (the
// row is reloaded per dispatch): llvmpipe/lavapipe silently ends every loop of a shader
// invocation after 65535 back-edges in total, and one token costs ~2·dk of them here.

// Largest supported key head dim (the private row array); the host rejects larger dk.

struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    conv_dim: u32,
    t0: u32,    // first token of this dispatch
    n_tok: u32, // tokens in this dispatch
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;          // [T, conv_dim] = [q | k | v]
@group(0) @binding(2) var<storage, read> g: array<f32>;          // [T, Hv]
@group(0) @binding(3) var<storage, read> beta: array<f32>;       // [T, Hv]
@group(0) @binding(4) var<storage, read_write> state: array<f32>; // [Hv, dv, dk]
@group(0) @binding(5) var<storage, read_write> out: array<f32>;   // [T, Hv*dv]

var<workgroup> k_sh: array<f32, DELTA_MAX_DK>;
var<workgroup> q_sh: array<f32, DELTA_MAX_DK>;

@compute @workgroup_size(DELTA_ROWS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let j = wg.y;                      // value head
    let c = wg.x * DELTA_ROWS + li;          // the state row this invocation owns
    let owns_row = c < P.dv;             // inactive invocations still take part in the barriers
    let dk = P.dk;
    let kh = j % P.hk;                 // key head of value head j (tiled rule)
    let key_dim = P.hk * dk;
    let q_off = kh * dk;
    let k_off = key_dim + kh * dk;
    let v_off = 2u * key_dim + j * P.dv + c;
    let row = (j * P.dv + c) * dk;

    var m: array<f32, DELTA_MAX_DK>;
    if (owns_row) {
        for (var i = 0u; i < dk; i++) {
            m[i] = state[row + i];
        }
    }

    for (var t = P.t0; t < P.t0 + P.n_tok; t++) {
        let base = t * P.conv_dim;
        // The previous token's readers must be done before k, q are overwritten.
        workgroupBarrier();
        for (var i = li; i < dk; i += DELTA_ROWS) {
            k_sh[i] = u[base + k_off + i];
            q_sh[i] = u[base + q_off + i];
        }
        workgroupBarrier();
        if (owns_row) {
            let decay = exp(g[t * P.hv + j]);
            var kv = 0.0;
            for (var i = 0u; i < dk; i++) {
                kv += m[i] * k_sh[i];
            }
            let delta = beta[t * P.hv + j] * (u[base + v_off] - decay * kv);
            var o = 0.0;
            for (var i = 0u; i < dk; i++) {
                m[i] = decay * m[i] + delta * k_sh[i];
                o += m[i] * q_sh[i];
            }
            out[(t * P.hv + j) * P.dv + c] = o;
        }
    }

    if (owns_row) {
        for (var i = 0u; i < dk; i++) {
            state[row + i] = m[i];
        }
    }
}
