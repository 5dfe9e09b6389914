// x quantized for the packed-integer-dot matrix-vector units (RILL_WGPU_MV_DOT, caps.rs): one
// invocation per block of 32 elements, in lib_dot_prep.wgsl's format.
struct Params {
    blocks: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Q: array<vec4<u32>>;

// Block `blk` of x (elements 32 blk ..) into vec4s XQ_VEC4 blk .. of the planes.
fn dot_prep_block(blk: u32) {
    let i = 8u * blk;
    var m = 0.0;
    for (var k = 0u; k < 8u; k++) {
        m = max(m, xp_absmax(X[i + k]));
    }
    let sc = xp_scale(m);
    let o = XQ_VEC4 * blk;
    var sums = vec2<f32>(0.0);
    for (var h = 0u; h < 2u; h++) {
        let x0 = X[i + 4u * h];
        let x1 = X[i + 4u * h + 1u];
        let x2 = X[i + 4u * h + 2u];
        let x3 = X[i + 4u * h + 3u];
        let p0 = planes4(x0 * sc.inv);
        let p1 = planes4(x1 * sc.inv);
        let p2 = planes4(x2 * sc.inv);
        let p3 = planes4(x3 * sc.inv);
        Q[o + h] = vec4<u32>(p0.x, p1.x, p2.x, p3.x);
        Q[o + 2u + h] = vec4<u32>(p0.y, p1.y, p2.y, p3.y);
        Q[o + 4u + h] = vec4<u32>(p0.z, p1.z, p2.z, p3.z);
        sums[h] = xp_sum(x0, x1, x2, x3);
    }
    Q[o + 6u] = vec4<u32>(sc.word, bitcast<u32>(sums.x), bitcast<u32>(sums.y), 0u);
}

@compute @workgroup_size(MVD_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let blk = linear_wg(wg, nwg) * MVD_WG + li;
    if (blk >= P.blocks) {
        return;
    }
    dot_prep_block(blk);
}
