// Flash-decoding over a step whose rows belong to different sequences (backend/rows.rs), first
// pass: row b (one query token, its (slot, pos) read from `rows` on the device) attends to its
// slot's cache rows slot * ctx + 0..=pos of the pools [S * ctx, Hkv * D]. One workgroup per
// (row, query head, piece of the row's keys: lib_att_rows.wgsl) on grid z, over the key range with
// lib_attention.wgsl; each writes [m, l, o_0 .. o_{d-1}] to part[((b - b0) * n_head + h) *
// ATT_SPLITS + piece]. Pieces past the row's keys return at once (the merge,
// attention_rows_combine.wgsl, reads only the pieces that hold keys).
//
// A pool larger than one storage binding is bound in pieces of whole slots (slot0 .. slot0 +
// n_slots), one dispatch each: a row whose slot lies in another piece returns at once. Rows are
// done in batches from b0 so that `part` fits one binding too.
struct Params {
    n_head: u32,
    group: u32, // query heads per KV head
    d: u32,     // head_dim
    scale: f32,
    ctx: u32,   // cache rows per slot
    slot0: u32, // the slots bound: slot0 .. slot0 + n_slots
    n_slots: u32,
    b0: u32,    // the batch's first row
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>; // [B, 2] = (slot, pos) per row
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lrow = linear_wg(wg, nwg); // (b - b0) * n_head + h
    let piece = wg.z;
    let b = P.b0 + lrow / P.n_head;
    let h = lrow % P.n_head;
    let d = P.d;
    // Uniform across the workgroup (its id and a read-only binding): the early returns leave
    // every barrier of attend() in uniform control flow.
    let slot = rows[2u * b];
    let n_keys = rows[2u * b + 1u] + 1u;
    let chunk = rows_chunk(n_keys);
    let k_begin = piece * chunk;
    if (slot < P.slot0 || slot - P.slot0 >= P.n_slots || k_begin >= n_keys) {
        return;
    }
    let k_end = min(k_begin + chunk, n_keys);
    let kv_stride = (P.n_head / P.group) * d;
    let kv_off = (slot - P.slot0) * P.ctx * kv_stride + (h / P.group) * d;
    let a = attend(li, (b * P.n_head + h) * d, kv_off, kv_stride, d, k_begin, k_end, P.scale);
    let base = (lrow * ATT_SPLITS + piece) * (d + 2u);
    if (li == 0u) {
        part[base] = a.m;
        part[base + 1u] = a.l;
    }
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < d) {
            part[base + 2u + dim] = a.o[r];
        }
    }
}
