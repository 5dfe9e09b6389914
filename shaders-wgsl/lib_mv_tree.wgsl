// The matrix-vector kernels' reduction through workgroup memory: a workgroup of MV_WG
// invocations is MV_WG / lw groups of lw lanes (flat index = group * lw + lane; lw a power of
// two), each invocation holding the partial sums of up to 4 of its rows in a vec4. Every group
// sums its lanes' values by a tree: log2(lw) barrier steps. Used without subgroups, and as the
// fallback of lib_mv_reduce_sg.wgsl.
var<workgroup> mv_red: array<vec4<f32>, MV_WG>;

// The group's sums, valid in its lane 0.
fn mv_tree(acc: vec4<f32>, flat: u32, lw: u32) -> vec4<f32> {
    mv_red[flat] = acc;
    workgroupBarrier();
    let lane = flat & (lw - 1u);
    for (var s = lw >> 1u; s > 0u; s >>= 1u) {
        if (lane < s) {
            mv_red[flat] += mv_red[flat + s];
        }
        workgroupBarrier();
    }
    let out = mv_red[flat];
    // mv_red is rewritten by the next call (matvec_swiglu sums twice or more).
    workgroupBarrier();
    return out;
}
