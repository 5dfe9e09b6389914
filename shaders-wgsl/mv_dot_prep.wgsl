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
    let b = xp_block(X[i], X[i + 1u], X[i + 2u], X[i + 3u], X[i + 4u], X[i + 5u], X[i + 6u], X[i + 7u]);
    for (var k = 0u; k < XQ_VEC4; k++) {
        Q[XQ_VEC4 * blk + k] = xp_word(b, k);
    }
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
