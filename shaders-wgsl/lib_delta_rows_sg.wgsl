// Row groups of delta_rule_recurrent.wgsl through subgroups: each subgroup owns one state row at a
// time (rows sg, sg + n_sg, ...) and sums it with subgroupAdd, no barrier. Correct for any
// subgroup size and any mapping of invocations to subgroups.
struct Lanes {
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
}

// Row slots sg, sg + n_sg, ...; elements lane, lane + size, ...
fn row_group(li: u32, lanes: Lanes) -> RowGroup {
    return RowGroup(lanes.sg, lanes.n_sg, lanes.lane, lanes.size);
}

// Passes over the block's rows: the same for every invocation.
fn row_iters(lanes: Lanes) -> u32 {
    return (DELTA_REC_ROWS + lanes.n_sg - 1u) / lanes.n_sg;
}

// The sum of x over the invocations of one row group.
fn row_sum(x: f32, li: u32, lanes: Lanes) -> f32 {
    return subgroupAdd(x);
}
