// attention_combine.wgsl (lib_att_merge.wgsl) with the gated attention's output gate applied as
// the output is written: out = sigmoid(gate) * merged (spec/MODEL.md §6), one workgroup per query
// row. The packed-dot variant (lib_att_xq.wgsl) also writes the row's int8 planes for the output
// projection's products; the plain one (lib_att_noxq.wgsl) writes none.
struct Params {
    d: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    let o = att_merge(row, li);
    var y = vec4<f32>(0.0);
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < P.d) {
            // As sigmoid_mul_assign.wgsl computes x * sigmoid(gate) on the merged value.
            y[r] = o[r] * sigmoid(gate[row * P.d + dim]);
            out[row * P.d + dim] = y[r];
        }
    }
    att_planes(row, li, y);
}
