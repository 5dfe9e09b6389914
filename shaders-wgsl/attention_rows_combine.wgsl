// Flash-decoding over a step of many sequences, second pass: each query row's merged output from
// the pieces of its keys attention_rows_split.wgsl wrote (lib_att_merge.wgsl; how many: the row's
// position, lib_att_rows.wgsl). One workgroup per (row, query head) of the batch from b0.
struct Params {
    d: u32,
    n_head: u32,
    b0: u32, // the batch's first row
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>; // [B, 2] = (slot, pos) per row
@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lrow = linear_wg(wg, nwg); // (b - b0) * n_head + h
    let b = P.b0 + lrow / P.n_head;
    let o = att_merge_n(lrow, li, rows_parts(rows[2u * b + 1u] + 1u));
    let at = (P.b0 * P.n_head + lrow) * P.d;
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < P.d) {
            out[at + dim] = o[r];
        }
    }
}
