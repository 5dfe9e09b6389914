// The matrix-vector kernels' reduction through workgroup memory: a workgroup of MV_WG
// invocations is MV_WG / lw groups of lw lanes (flat index = group * lw + lane; lw a power of
// two), each invocation holding MV_R partial sums (one per row it owns). Every group sums its
// lanes' values by a tree: log2(lw) barrier steps. Used without subgroups, and as the fallback
// of lib_mv_reduce_sg.wgsl.
var<workgroup> mv_red: array<f32, MV_WG * MV_R>;

// The group's sums, valid in its lane 0.
fn mv_tree(acc: array<f32, MV_R>, flat: u32, lw: u32) -> array<f32, MV_R> {
    for (var r = 0u; r < MV_R; r++) {
        mv_red[r * MV_WG + flat] = acc[r];
    }
    workgroupBarrier();
    let lane = flat & (lw - 1u);
    for (var s = lw >> 1u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var r = 0u; r < MV_R; r++) {
                mv_red[r * MV_WG + flat] += mv_red[r * MV_WG + flat + s];
            }
        }
        workgroupBarrier();
    }
    var out: array<f32, MV_R>;
    for (var r = 0u; r < MV_R; r++) {
        out[r] = mv_red[r * MV_WG + flat];
    }
    // mv_red is rewritten by the next call (matvec_swiglu sums twice).
    workgroupBarrier();
    return out;
}
