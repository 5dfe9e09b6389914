// out[t][j] = deq(table row ids[t], element j) for a table [vocab, d] in the block format
// spliced in above (deq/QK/BLOCK_BYTES), ids U32 [T], out [T, d]. One invocation per output value.
//
// The host cannot validate device-side ids without a readback, so an id >= vocab is guarded
// here: its row is written as zeros instead of reading past the table. (The CPU backend returns
// an error instead; the executor never produces such ids.)

struct Params {
    d: u32,
    n_tok: u32,
    vocab: u32,
    row_bytes: u32, // bytes of one table row: d / QK * BLOCK_BYTES
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let idx = linear_wg(wg, nwg) * ELT_WG + li;
    if (idx >= P.n_tok * P.d) {
        return;
    }
    let t = idx / P.d;
    let j = idx % P.d;
    let id = ids[t];
    if (id >= P.vocab) {
        out[idx] = 0.0;
        return;
    }
    out[idx] = deq(id * P.row_bytes + (j / QK) * BLOCK_BYTES, j % QK);
}
