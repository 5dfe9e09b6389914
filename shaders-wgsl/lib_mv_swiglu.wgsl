// The row groups of matvec_swiglu.wgsl and matvec_swiglu_xq.wgsl: the up weight's binding (the
// gate's is lib_mv_io.wgsl's W) and one invocation's MV_R gate and up rows.
@group(0) @binding(4) var<storage, read> W2: array<vec4<u32>>;

// An invocation's gate and up sums.
struct MvGateUp {
    g: MvAcc,
    u: MvAcc,
}

// The gate and up sums of the invocation's rows r0 .. r0 + MV_R - 1 over the token's x (f32 x at
// vec4 xb), valid in its row group's lane 0: each unit's x loaded once for both weights. Called
// in uniform control flow (the reduction's barriers).
fn mv_gate_up(r0: u32, flat: u32, lw: u32, xb: u32, lanes: MvLanes) -> MvGateUp {
    let rb_lo = mv_row_bytes(r0);
    let rb_hi = mv_row_bytes(r0 + 4u);
    var g = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    var up = g;
    for (var u = flat % lw; u < P.units; u += lw) {
        let x = mv_x(u, xb);
        wsel = 0u;
        g = mv_add(g, rb_lo, rb_hi, u, x);
        wsel = 1u;
        up = mv_add(up, rb_lo, rb_hi, u, x);
    }
    return MvGateUp(mv_sums(g, flat, lw, lanes), mv_sums(up, flat, lw, lanes));
}

// Output row r of the invocation: silu(gate) * up.
fn mv_swiglu_row(s: MvGateUp, r: u32) -> f32 {
    return silu(mv_row(s.g, r)) * mv_row(s.u, r);
}
