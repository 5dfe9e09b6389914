// Argmax of long rows (the LM head's ~250K logits), first pass: one workgroup per ARGMAX_CHUNK
// values of a row (grid z = chunk), so the whole GPU scans the row rather than one workgroup;
// each writes its chunk's best (value bits, index) to part[row][chunk] (lib_argmax.wgsl's rule).

struct Params {
    v: u32,      // row length
    chunks: u32, // ceil(v / ARGMAX_CHUNK)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<vec2<u32>>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    wg_scan(row * P.v, wg.z * ARGMAX_CHUNK, min(P.v, (wg.z + 1u) * ARGMAX_CHUNK), li);
    if (li == 0u) {
        part[row * P.chunks + wg.z] = vec2<u32>(bitcast<u32>(best_val[0]), best_idx[0]);
    }
}
