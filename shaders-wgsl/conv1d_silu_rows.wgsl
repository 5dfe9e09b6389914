// Causal depthwise conv1d + SiLU of a step whose rows belong to different sequences
// (backend/rows.rs): row b's one token x[b] against the K-1 previous inputs of its slot in the
// state pool [S * (K-1), C] (slot s is rows s*(K-1) .., oldest first), which then slides by one.
// One invocation per (channel, row): neighbouring invocations take neighbouring channels, so the
// loads and stores of every state row coalesce. The slot comes from `rows` on the device.
// The taps are summed in conv1d_causal_silu.wgsl's order (oldest first, newest last).
//
// A pool larger than one storage binding is bound in pieces of whole slots (slot0 .. slot0 +
// n_slots), one dispatch each: a row whose slot lies in another piece is skipped.

struct Params {
    c: u32,
    k: u32,
    slot0: u32, // the slots bound: slot0 .. slot0 + n_slots
    n_slots: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>;        // [B, 2] = (slot, pos) per row
@group(0) @binding(2) var<storage, read> x: array<f32>;           // [B, C]
@group(0) @binding(3) var<storage, read> w: array<f32>;           // [C, K]
@group(0) @binding(4) var<storage, read_write> state: array<f32>; // the piece's slots
@group(0) @binding(5) var<storage, read_write> out: array<f32>;   // [B, C]

@compute @workgroup_size(CONV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c = wg.x * CONV_WG + li;
    let b = wg.y;
    let slot = rows[2u * b];
    if (c >= P.c || slot < P.slot0 || slot - P.slot0 >= P.n_slots) {
        return;
    }
    let km1 = P.k - 1u;
    let first = (slot - P.slot0) * km1; // the slot's oldest state row
    let xt = x[b * P.c + c];
    var acc = 0.0;
    for (var j = 0u; j < km1; j++) {
        acc += w[c * P.k + j] * state[(first + j) * P.c + c];
    }
    acc += w[c * P.k + km1] * xt;
    out[b * P.c + c] = silu(acc);
    // Slide by one token: this invocation alone touches channel c of the slot.
    for (var j = 0u; j + 1u < km1; j++) {
        state[(first + j) * P.c + c] = state[(first + j + 1u) * P.c + c];
    }
    state[(first + km1 - 1u) * P.c + c] = xt;
}
