// The gated delta rule of a step whose rows belong to different sequences (backend/rows.rs): row
// b's one token (u, g, beta row b) updates the state of its slot in the pool [S * Hv * dv, dk]
// (slot s, value head j, state row c at row (s * Hv + j) * dv + c) and writes out row b.
//
// The work is laid out as delta_rule_recurrent.wgsl's for one token (see there for the update):
// one workgroup per (block of DELTA_REC_ROWS state rows, value head j, row b on grid z), each
// state row owned by a row group (lib_delta_rows_sg.wgsl / lib_delta_rows_plain.wgsl) whose
// lanes take its elements i ≡ lane (mod width), so every load and store of the state coalesces
// and each row's state is read and written once per step. The slot comes from `rows` on the
// device, so a recorded step stays valid when the rows change.
//
// A pool larger than one storage binding is bound in pieces of whole slots (slot0 .. slot0 +
// n_slots), one dispatch each: a row whose slot lies in another piece returns at once.

struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    conv_dim: u32,
    slot0: u32, // the slots bound: slot0 .. slot0 + n_slots
    n_slots: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>;        // [B, 2] = (slot, pos) per row
@group(0) @binding(2) var<storage, read> u: array<f32>;           // [B, conv_dim] = [q | k | v]
@group(0) @binding(3) var<storage, read> g: array<f32>;           // [B, Hv]
@group(0) @binding(4) var<storage, read> beta: array<f32>;        // [B, Hv]
@group(0) @binding(5) var<storage, read_write> state: array<f32>; // the piece's slots [n_slots * Hv * dv, dk]
@group(0) @binding(6) var<storage, read_write> out: array<f32>;   // [B, Hv*dv]

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
    let t = wg.z;                      // the step's row
    // Uniform across the workgroup (its id and a read-only binding): the early return leaves
    // the row sums' barriers in uniform control flow.
    let slot = rows[2u * t];
    if (slot < P.slot0 || slot - P.slot0 >= P.n_slots) {
        return;
    }
    let dk = P.dk;
    let kh = j % P.hk;                 // key head of value head j (tiled rule)
    let key_dim = P.hk * dk;
    let grp = row_group(li, lanes);
    let iters = row_iters(lanes);
    let base = t * P.conv_dim;
    let q_at = base + kh * dk;
    let k_at = base + key_dim + kh * dk;
    let decay = exp(g[t * P.hv + j]);
    let b = beta[t * P.hv + j];
    let head = ((slot - P.slot0) * P.hv + j) * P.dv;
    for (var it = 0u; it < iters; it++) {
        let r = grp.first + it * grp.step; // row slot within the block
        let c = wg.x * DELTA_REC_ROWS + r;  // the state row
        let live = r < DELTA_REC_ROWS && c < P.dv;
        let row = (head + c) * dk;
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
