// The matrix-vector kernels' reduction through subgroup shuffles. Groups are laid out over the
// subgroups (flat = subgroup id * subgroup size + lane), so a group of lw <= subgroup size lanes
// is lw neighbouring lanes of one subgroup and sums itself with log2(lw) butterfly shuffles: no
// workgroup memory and no barrier. Wider groups add their subgroups' sums in workgroup memory.
// Where the subgroups do not tile the workgroup exactly (partial subgroups, which no driver we
// know of makes for these sizes) the mapping is not a bijection, so the kernel falls back to
// local indices and lib_mv_tree.wgsl: correct for any subgroup size and layout.
struct MvLanes {
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
    @builtin(subgroup_size) size: u32,
}

// Uniform over the workgroup: every subgroup is full.
fn mv_full(lanes: MvLanes) -> bool {
    return lanes.n_sg * lanes.size == MV_WG;
}

// The invocation's place in the workgroup: group = flat / lw, lane = flat % lw.
fn mv_flat(li: u32, lanes: MvLanes) -> u32 {
    if (mv_full(lanes)) {
        return lanes.sg * lanes.size + lanes.lane;
    }
    return li;
}

// The sums over each group's lw lanes of acc (up to 4 rows), valid in the group's lane 0.
fn mv_sum(acc: vec4<f32>, flat: u32, lw: u32, lanes: MvLanes) -> vec4<f32> {
    if (!mv_full(lanes)) {
        return mv_tree(acc, flat, lw);
    }
    var v = acc;
    for (var k = min(lw, lanes.size) >> 1u; k > 0u; k >>= 1u) {
        v += subgroupShuffleXor(v, k);
    }
    if (lw <= lanes.size) {
        return v;
    }
    // lw / size subgroups per group: their lane 0s meet in workgroup memory.
    if (lanes.lane == 0u) {
        mv_red[lanes.sg] = v;
    }
    workgroupBarrier();
    let per = lw / lanes.size;
    let first = lanes.sg - lanes.sg % per;
    var out = vec4<f32>(0.0);
    for (var k = 0u; k < per; k++) {
        out += mv_red[first + k];
    }
    workgroupBarrier();
    return out;
}
