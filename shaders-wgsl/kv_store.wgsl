// Append T rows to the KV cache at the position held on the device (so a replayed step writes
// the current token's row): k_cache[pos + t] = k[t], v_cache[pos + t] = v[t]; k, v [T, W],
// caches [ctx, W]. Rows at or past ctx are dropped (the host checks the context first).
struct Params {
    n: u32,  // T * W
    w: u32,
    ctx: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i >= P.n) {
        return;
    }
    let row = pos[0] + i / P.w;
    if (row >= P.ctx) {
        return;
    }
    let o = row * P.w + i % P.w;
    k_cache[o] = k[i];
    v_cache[o] = v[i];
}
