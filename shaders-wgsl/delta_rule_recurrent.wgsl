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

// The rows of its block an invocation works on (first, first + step, ... below DELTA_REC_ROWS)
// and its place in a row (elements lane, lane + width, ...); from the row-group library.
struct RowGroup {
    first: u32,
    step: u32,
    lane: u32,
    width: u32,
}

@compute @workgroup_size(DELTA_REC_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let j = wg.y;                      // value head
    let dk = P.dk;
    let kh = j % P.hk;                 // key head of value head j (tiled rule)
    let key_dim = P.hk * dk;
    let grp = row_group(li, lanes);
    // Uniform over the workgroup: the row sums may synchronize it.
    let iters = row_iters(lanes);
    for (var t = P.t0; t < P.t0 + P.n_tok; t++) {
        let base = t * P.conv_dim;
        let q_at = base + kh * dk;
        let k_at = base + key_dim + kh * dk;
        let decay = exp(g[t * P.hv + j]);
        let b = beta[t * P.hv + j];
        for (var it = 0u; it < iters; it++) {
            let r = grp.first + it * grp.step; // row slot within the block
            let c = wg.x * DELTA_REC_ROWS + r;  // the state row
            let live = r < DELTA_REC_ROWS && c < P.dv;
            let row = (j * P.dv + c) * dk;
            var kv = 0.0;
            if (live) {
                for (var i = grp.lane; i < dk; i += grp.width) {
                    kv += state[row + i] * u[k_at + i];
                }
            }
            kv = row_sum(kv, li, lanes);
            var o = 0.0;
            if (live) {
                let delta = b * (u[base + 2u * key_dim + j * P.dv + c] - decay * kv);
                for (var i = grp.lane; i < dk; i += grp.width) {
                    let m = decay * state[row + i] + delta * u[k_at + i];
                    state[row + i] = m;
                    o += m * u[q_at + i];
                }
            }
            o = row_sum(o, li, lanes);
            if (live && grp.lane == 0u) {
                out[(t * P.hv + j) * P.dv + c] = o;
            }
        }
    }
}
