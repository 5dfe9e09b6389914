// matvec_swiglu.wgsl that also writes its output's int8 planes for the packed-integer-dot products
// (lib_dot_prep.wgsl; RILL_WGPU_MV_DOT), so the FFN's down product needs no mv_dot_prep dispatch:
// rows (and row0, n_out) are whole 32-element blocks, token t's planes at vec4
// XQ_VEC4 * (t * n_out + row0) / 32 of xq_out (the layout mv_dot_prep writes for the whole out).
//
// A block's planes need its max |y|, so a workgroup owns whole aligned blocks: a span of
// max(32, rows per pass) rows, where a pass is matvec_swiglu's workgroup ((MV_WG / lw) * MV_R
// rows, a power of two): 32 / that many passes, or one pass of several blocks. Its row groups'
// lane 0s store their outputs to out and to workgroup memory; then one invocation per block
// writes its planes with mv_dot_prep's own xp_block (lib_att_xq.wgsl does the same), so they are
// bit for bit what mv_dot_prep would make of out.
@group(0) @binding(5) var<storage, read_write> xq_out: array<vec4<u32>>;

// The largest span (one lane per row group); 8 KiB at the largest geometry (256 x 8 rows).
const SW_SPAN_MAX: u32 = max(32u, MV_WG * MV_R);
var<workgroup> sw_y: array<f32, SW_SPAN_MAX>;

// vec4 of the span's outputs from element i.
fn sw_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(sw_y[i], sw_y[i + 1u], sw_y[i + 2u], sw_y[i + 3u]);
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let per = (MV_WG / lw) * MV_R;
    let span = max(32u, per);
    let first = linear_wg(wg, nwg) * span;
    // Uniform per workgroup, so the barriers below stay in uniform control flow.
    if (first >= P.rows) {
        return;
    }
    let flat = mv_flat(li, lanes);
    let t = wg.z;
    let xb = t * (P.n_in / 4u);
    let o0 = t * P.n_out + P.row0 + first;
    // Uniform trip count: every invocation takes part in every pass's reduction.
    for (var n = 0u; n < span / per; n++) {
        let l0 = n * per + (flat / lw) * MV_R;
        let s = mv_gate_up(first + l0, flat, lw, xb, lanes);
        if (flat % lw == 0u) {
            for (var r = 0u; r < MV_R; r++) {
                let y = mv_swiglu_row(s, r);
                sw_y[l0 + r] = y;
                if (first + l0 + r < P.rows) {
                    out[o0 + l0 + r] = y;
                }
            }
        }
    }
    workgroupBarrier();
    // The span's blocks within the piece (its rows are whole blocks): invocation b writes block b
    // whole with mv_dot_prep's xp_block (a few hundred operations; as lib_att_xq.wgsl).
    let blocks = min(span, P.rows - first) / 32u;
    for (var b = li; b < blocks; b += MV_WG) {
        let i = 32u * b;
        let q = xp_block(sw_vec4(i), sw_vec4(i + 4u), sw_vec4(i + 8u), sw_vec4(i + 12u), sw_vec4(i + 16u),
                         sw_vec4(i + 20u), sw_vec4(i + 24u), sw_vec4(i + 28u));
        let o = XQ_VEC4 * (o0 / 32u + b);
        for (var k = 0u; k < XQ_VEC4; k++) {
            xq_out[o + k] = xp_word(q, k);
        }
    }
}
