// Flash-decoding, second pass: the merged row of the ATT_SPLITS pieces attention_split.wgsl wrote
// (lib_att_merge.wgsl). One workgroup per row.
struct Params {
    d: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    let o = att_merge(row, li);
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < P.d) {
            out[row * P.d + dim] = o[r];
        }
    }
}
