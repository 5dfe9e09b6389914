// The RMS norms that also write their output's int8 planes for the packed-integer-dot
// matrix-vector units (lib_dot_prep.wgsl; RILL_WGPU_MV_DOT), so the product that reads the output
// needs no mv_dot_prep dispatch: d is whole 32-element blocks, row r's planes at vec4
// XQ_VEC4 * r * d / 32 of `xq` (the layout mv_dot_prep writes for the whole tensor). The binding
// is declared by lib_norm_xq4.wgsl or lib_norm_xq5.wgsl (after the op's own bindings).

fn xp_load(v: u32) -> vec4<f32> {
    return vec4<f32>(out[4u * v], out[4u * v + 1u], out[4u * v + 2u], out[4u * v + 3u]);
}

fn xp_store(v: u32, q: vec4<u32>) {
    xq[v] = q;
}

// After the row's output is written: its blocks, each read back by one invocation.
fn norm_finish(base: u32, li: u32) {
    // Other invocations wrote the elements of a block: their stores must be visible first.
    storageBarrier();
    workgroupBarrier();
    for (var b = li; b < P.d / 32u; b += ROW_WG) {
        dot_prep_block(base / 32u + b);
    }
}
