// Causal GQA softmax attention. q [T, H*D]; k_cache, v_cache [ctx, Hkv*D]; out [T, H*D].
// Query row t sits at absolute position pos + t (pos read on the device) and attends to cache
// rows 0..=pos+t; query head h reads KV head h / (H / Hkv). One workgroup per (token, query
// head) over the whole key range (lib_attention.wgsl); at the end out = o / l.

@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg); // = t * n_head + h
    let t = row / P.n_head;
    let h = row % P.n_head;
    let d = P.d;
    let kv_stride = (P.n_head / P.group) * d;
    let a = attend(li, row * d, (h / P.group) * d, kv_stride, d, 0u, pos[0] + t + 1u, P.scale);
    let inv = 1.0 / a.l;
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < d) {
            out[row * d + dim] = a.o[r] * inv;
        }
    }
}
