// The oct exchange of lib_norm_dot.wgsl through subgroup shuffles: octs are laid out over the
// subgroups (flat = subgroup id * subgroup size + lane, as lib_mv_reduce_sg.wgsl does), so an
// oct is 8 aligned lanes of one subgroup: four shuffles bring the half block, one more the other
// half's max. No workgroup memory and no barrier. Where the subgroups do not tile the workgroup
// exactly or have fewer than 8 lanes, local indices and workgroup memory (oct_gather_wg).

// Uniform over the workgroup.
fn oct_lanes(lanes: Lanes) -> bool {
    return lanes.size >= 8u && lanes.n_sg * lanes.size == ROW_WG;
}

fn oct_flat(li: u32, lanes: Lanes) -> u32 {
    if (oct_lanes(lanes)) {
        return lanes.sg * lanes.size + lanes.lane;
    }
    return li;
}

fn oct_gather(v: vec4<f32>, flat: u32, lanes: Lanes) -> Oct {
    if (!oct_lanes(lanes)) {
        return oct_gather_wg(v, flat);
    }
    let q = lanes.lane & ~3u;
    let quad = mat4x4<f32>(subgroupShuffle(v, q), subgroupShuffle(v, q + 1u), subgroupShuffle(v, q + 2u),
                           subgroupShuffle(v, q + 3u));
    let m = oct_half_max(quad);
    return Oct(quad, max(m, subgroupShuffleXor(m, 4u)));
}
