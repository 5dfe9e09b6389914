// Parameters of the MoE experts with the shared expert as entry k of each token's k + 1
// (moe_swiglu_sh.wgsl: the gate and up products into hidden rows; moe_down_sh.wgsl: the down
// products and the weighted sum). Entry s = t * (k + 1) + j of token t is routed slot j < k (expert
// ids[t * k + j], skipped when >= n_exp) or the shared expert (j = k, whose matrices hold one
// expert). Both kernels lay out a workgroup as matvec.wgsl's: (MV_WG / lw) * MV_R rows of one
// entry (gate/up) or one token (down), lw = P.lanes.
struct Params {
    n_tok: u32,
    k: u32,
    n_exp: u32,
    rows: u32,       // rows of one expert's matrix
    n_in: u32,
    row_bytes: u32,
    row_groups: u32, // workgroups per entry (gate/up) or per token (down)
    units: u32,      // n_in / MV_UNIT
    lanes: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// The first row of workgroup g's invocation `flat`.
fn sh_first_row(g: u32, flat: u32) -> u32 {
    return (g % P.row_groups) * (MV_WG / P.lanes) * MV_R + (flat / P.lanes) * MV_R;
}

// The byte offsets of rows r0 .. r0 + 3 of the expert whose first row is eb; rows past the
// expert re-read its last row and are not stored.
fn sh_row_bytes(eb: u32, r0: u32) -> vec4<u32> {
    let rows = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u));
    return (vec4<u32>(eb) + rows) * P.row_bytes;
}
