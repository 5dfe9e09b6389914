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

// The sums over each group's lw lanes of acc, valid in the group's lane 0.
fn mv_sum(acc: array<f32, MV_R>, flat: u32, lw: u32, lanes: MvLanes) -> array<f32, MV_R> {
    if (!mv_full(lanes)) {
        return mv_tree(acc, flat, lw);
    }
    var v = acc;
    for (var k = min(lw, lanes.size) >> 1u; k > 0u; k >>= 1u) {
        for (var r = 0u; r < MV_R; r++) {
            v[r] += subgroupShuffleXor(v[r], k);
        }
    }
    if (lw <= lanes.size) {
        return v;
    }
    // lw / size subgroups per group: their lane 0s meet in workgroup memory.
    if (lanes.lane == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            mv_red[r * MV_WG + lanes.sg] = v[r];
        }
    }
    workgroupBarrier();
    let per = lw / lanes.size;
    let first = lanes.sg - lanes.sg % per;
    var out: array<f32, MV_R>;
    for (var r = 0u; r < MV_R; r++) {
        var t = 0.0;
        for (var k = 0u; k < per; k++) {
            t += mv_red[r * MV_WG + first + k];
        }
        out[r] = t;
    }
    workgroupBarrier();
    return out;
}
