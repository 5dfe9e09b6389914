// The int8 planes of attention_combine_gate.wgsl's output row for the packed-integer-dot products
// (lib_dot_prep.wgsl's format; the host takes this variant where d is whole 32-element blocks).
// An invocation holds the dims li + r * ATT_WG, not a block's contiguous elements, so the row goes
// through workgroup memory and invocation b < d / 32 writes block b whole (xp_block, as
// mv_dot_prep.wgsl does): at most 8 blocks a row, a few hundred operations each.
@group(0) @binding(4) var<storage, read_write> xq: array<vec4<u32>>;

var<workgroup> att_y: array<f32, ATT_MAX_D>;

// Called by every invocation (uniform control flow: the barrier).
fn att_planes(row: u32, li: u32, y: vec4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < P.d) {
            att_y[dim] = y[r];
        }
    }
    workgroupBarrier();
    let blocks = P.d / 32u;
    if (li < blocks) {
        let i = 32u * li;
        let b = xp_block(att_vec4(i), att_vec4(i + 4u), att_vec4(i + 8u), att_vec4(i + 12u), att_vec4(i + 16u),
                         att_vec4(i + 20u), att_vec4(i + 24u), att_vec4(i + 28u));
        let o = XQ_VEC4 * (row * blocks + li);
        for (var k = 0u; k < XQ_VEC4; k++) {
            xq[o + k] = xp_word(b, k);
        }
    }
}

// Elements i .. i + 3 of the row.
fn att_vec4(i: u32) -> vec4<f32> {
    return vec4<f32>(att_y[i], att_y[i + 1u], att_y[i + 2u], att_y[i + 3u]);
}
