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

@compute @workgroup_size(DELTA_REC_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let j = wg.y; // value head
    let t = wg.z; // the step's row
    // Uniform across the workgroup (its id and a read-only binding): the early return leaves
    // the row sums' barriers in uniform control flow.
    let slot = rows[2u * t];
    if (slot < P.slot0 || slot - P.slot0 >= P.n_slots) {
        return;
    }
    delta_token(t, j, ((slot - P.slot0) * P.hv + j) * P.dv, wg.x, li, lanes);
}
