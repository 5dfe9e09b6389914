// Row-wise argmax of logits [T, V] into out [T] (U32), rows of at most ARGMAX_CHUNK values (longer
// rows take argmax_split.wgsl + argmax_combine.wgsl). One workgroup per row: each invocation scans
// a strided slice of the row, then a tree reduction picks the winner (lib_argmax.wgsl's rule).

struct Params {
    v: u32, // row length
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    wg_scan(row * P.v, 0u, P.v, li);
    if (li == 0u) {
        out[row] = argmax_result(best_val[0], best_idx[0]);
    }
}
