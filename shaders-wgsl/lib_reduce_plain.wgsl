// Workgroup sums through a tree in workgroup memory (no subgroups: the browser, RILL_WGPU_PLAIN=1).
struct Lanes {
    // Unused: keeps the entry point's signature the same as with subgroups.
    @builtin(local_invocation_id) unused: vec3<u32>,
}

var<workgroup> red_wg: array<vec4<f32>, 256>;

// The sum over the workgroup of v (every invocation gets it); n = invocations, a power of two
// of at most 256, li = local_invocation_index.
fn wg_sum4(v: vec4<f32>, li: u32, n: u32, lanes: Lanes) -> vec4<f32> {
    red_wg[li] = v;
    workgroupBarrier();
    for (var s = n / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red_wg[li] += red_wg[li + s];
        }
        workgroupBarrier();
    }
    let t = red_wg[0];
    // red_wg is rewritten by the next call.
    workgroupBarrier();
    return t;
}

fn wg_sum(v: f32, li: u32, n: u32, lanes: Lanes) -> f32 {
    return wg_sum4(vec4<f32>(v, 0.0, 0.0, 0.0), li, n, lanes).x;
}
