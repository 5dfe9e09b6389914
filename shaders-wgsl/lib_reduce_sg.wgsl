// Workgroup sums through subgroup operations: each subgroup adds its values with subgroupAdd,
// subgroup leaders meet in workgroup memory. Correct for any subgroup size and any mapping of
// invocations to subgroups (every invocation contributes to every component).
struct Lanes {
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
    @builtin(subgroup_size) size: u32,
}

// One slot per subgroup: subgroups have at least 4 invocations, our workgroups at most 256.
var<workgroup> red_sg: array<vec4<f32>, 64>;

// The sum over the workgroup of v (every invocation gets it); n = invocations (unused here).
fn wg_sum4(v: vec4<f32>, li: u32, n: u32, lanes: Lanes) -> vec4<f32> {
    let s = subgroupAdd(v);
    if (lanes.lane == 0u) {
        red_sg[lanes.sg] = s;
    }
    workgroupBarrier();
    var t = vec4<f32>(0.0);
    for (var i = 0u; i < lanes.n_sg; i++) {
        t += red_sg[i];
    }
    // red_sg is rewritten by the next call.
    workgroupBarrier();
    return t;
}

fn wg_sum(v: f32, li: u32, n: u32, lanes: Lanes) -> f32 {
    return wg_sum4(vec4<f32>(v, 0.0, 0.0, 0.0), li, n, lanes).x;
}
