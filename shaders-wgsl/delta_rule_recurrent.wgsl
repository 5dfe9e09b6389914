// Gated delta rule, token by token (spec/DELTANET.md A.2/A.3), on the value-major state
// M [Hv, dv, dk] (row c = value index, contiguous over the key index i).
//
// One workgroup per (value head j, block of DELTA_REC_ROWS state rows); each row is owned by a
// group of lanes (lib_delta_rows_sg.wgsl: one subgroup; lib_delta_rows_plain.wgsl: DELTA_LANES
// invocations that sum through workgroup memory). A lane holds the elements i ≡ lane (mod width),
// so a group's loads and stores of a row coalesce. Per token, each row does:
//   m     = e^g · (M_c · k)                 (prediction from the decayed row: a row sum)
//   δ     = β · (v[c] − m)
//   M_c   = e^g · M_c + δ · k
//   o[c]  = M_c · q                         (with the updated row: a row sum)
// Every sum runs along a row of M, never a column, so the transposed-state bug (A.4) cannot occur.
// Decode (T = 1) is one pass over the state spread over ceil(dv / DELTA_REC_ROWS) × Hv workgroups
// (512 for the 9B) instead of one invocation walking a whole row. Between tokens the state stays
// in memory: each lane rereads only the elements it wrote (from cache), so no barrier orders it.
// The host splits long sequences into dispatches of at most a few hundred tokens: llvmpipe/lavapipe
// silently ends every loop of a shader invocation after 65535 back-edges in total.

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

@compute @workgroup_size(DELTA_REC_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let j = wg.y; // value head
    for (var t = P.t0; t < P.t0 + P.n_tok; t++) {
        delta_token(t, j, j * P.dv, wg.x, li, lanes);
    }
}
