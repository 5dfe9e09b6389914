// x quantized for the packed-integer-dot matrix-vector units (RILL_WGPU_MV_DOT, caps.rs): one
// invocation per block of 32 elements, the block's work is lib_dot_prep.wgsl's.
struct Params {
    blocks: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Q: array<vec4<u32>>;

fn xp_load(v: u32) -> vec4<f32> {
    return X[v];
}

fn xp_store(v: u32, q: vec4<u32>) {
    Q[v] = q;
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
