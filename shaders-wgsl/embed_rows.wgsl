// out[t] = dequant(table row ids[t]) for the rows of one piece of the table, one workgroup per
// token reading only its row, 8 elements per invocation step (`deq8`). d is a multiple of 8.
// An id >= vocab gives a zero row (written by the first piece): the host cannot see device ids
// without a readback, and the executor never produces such ids.
struct Params {
    d: u32,
    n_tok: u32,
    vocab: u32,
    row_bytes: u32,
    row0: u32,  // first table row of this piece
    rows: u32,  // rows in this piece
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let t = linear_wg(wg, nwg);
    if (t >= P.n_tok) {
        return;
    }
    let id = ids[t];
    let o = t * (P.d / 4u);
    if (id >= P.vocab) {
        if (P.row0 == 0u) {
            for (var e = li; e < P.d / 4u; e += ROW_WG) {
                out[o + e] = vec4<f32>(0.0);
            }
        }
        return;
    }
    if (id < P.row0 || id - P.row0 >= P.rows) {
        return;
    }
    let rb = (id - P.row0) * P.row_bytes;
    for (var e = 8u * li; e < P.d; e += 8u * ROW_WG) {
        let v = deq8(rb + (e / QK) * BLOCK_BYTES, e % QK);
        out[o + e / 4u] = v.a;
        out[o + e / 4u + 1u] = v.b;
    }
}
