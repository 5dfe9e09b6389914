// Argmax of long rows, second pass: one workgroup per row picks the best of the row's chunk
// results from argmax_split.wgsl (their indices are the row's, so ties still go to the first).

struct Params {
    chunks: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    var bv = from_bits(0x7fc00000u); // NaN
    var bi = 0xffffffffu;
    for (var c = li; c < P.chunks; c += ROW_WG) {
        let p = part[row * P.chunks + c];
        let x = bitcast<f32>(p.x);
        if (better(x, p.y, bv, bi)) {
            bv = x;
            bi = p.y;
        }
    }
    wg_best(bv, bi, li);
    if (li == 0u) {
        out[row] = argmax_result(best_val[0], best_idx[0]);
    }
}
