// The matrix-vector kernels' reduction without subgroups (the browser, RILL_WGPU_PLAIN=1): groups
// are consecutive local invocation indices, summed by lib_mv_tree.wgsl.
struct MvLanes {
    // Unused: keeps the entry point's signature the same as with subgroups.
    @builtin(local_invocation_id) unused: vec3<u32>,
}

// The invocation's place in the workgroup: group = flat / lw, lane = flat % lw.
fn mv_flat(li: u32, lanes: MvLanes) -> u32 {
    return li;
}

// The sums over each group's lw lanes of acc (up to 4 rows), valid in the group's lane 0.
fn mv_sum(acc: vec4<f32>, flat: u32, lw: u32, lanes: MvLanes) -> vec4<f32> {
    return mv_tree(acc, flat, lw);
}
