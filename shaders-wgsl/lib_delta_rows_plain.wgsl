// Row groups of delta_rule_recurrent.wgsl without subgroups (the browser, RILL_WGPU_PLAIN=1):
// invocations li = r·DELTA_LANES + lane own row slot r (DELTA_REC_WG = DELTA_REC_ROWS·DELTA_LANES)
// and sum through workgroup memory.
struct Lanes {
    // Unused: keeps the entry point's signature the same as with subgroups.
    @builtin(local_invocation_id) unused: vec3<u32>,
}

// One row slot per DELTA_LANES invocations, one pass.
fn row_group(li: u32, lanes: Lanes) -> RowGroup {
    return RowGroup(li / DELTA_LANES, DELTA_REC_ROWS, li % DELTA_LANES, DELTA_LANES);
}

fn row_iters(lanes: Lanes) -> u32 {
    return 1u;
}

// One partial sum per invocation, four to a vector so that a row's are read in DELTA_LANES / 4
// loads.
var<workgroup> row_part: array<vec4<f32>, DELTA_REC_WG / 4u>;

// The sum of x over the DELTA_LANES invocations of li's row; every invocation must call it.
fn row_sum(x: f32, li: u32, lanes: Lanes) -> f32 {
    row_part[li / 4u][li % 4u] = x;
    workgroupBarrier();
    let first = (li / DELTA_LANES) * (DELTA_LANES / 4u);
    var s = vec4<f32>(0.0);
    for (var n = 0u; n < DELTA_LANES / 4u; n++) {
        s += row_part[first + n];
    }
    // row_part is rewritten by the next call.
    workgroupBarrier();
    return (s.x + s.y) + (s.z + s.w);
}
