// The KV-cache append of a step whose rows belong to different sequences (backend/rows.rs): row
// b's k and v [B, W] go to row slot * ctx + pos of the pools [S * ctx, W], (slot, pos) read from
// `rows` on the device (so a replayed step writes the current rows). One invocation per element.
//
// A pool larger than one storage binding is bound in pieces of whole slots (slot0 .. slot0 +
// n_slots), one dispatch each: a row whose slot lies in another piece is skipped.
struct Params {
    n: u32,  // B * W
    w: u32,
    ctx: u32,
    slot0: u32, // the slots bound: slot0 .. slot0 + n_slots
    n_slots: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>; // [B, 2] = (slot, pos) per row
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_pool: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_pool: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i >= P.n) {
        return;
    }
    let b = i / P.w;
    let slot = rows[2u * b];
    let pos = rows[2u * b + 1u];
    // The host checked every position against ctx; a stale one is dropped, not written elsewhere.
    if (slot < P.slot0 || slot - P.slot0 >= P.n_slots || pos >= P.ctx) {
        return;
    }
    let o = ((slot - P.slot0) * P.ctx + pos) * P.w + i % P.w;
    k_pool[o] = k[i];
    v_pool[o] = v[i];
}
