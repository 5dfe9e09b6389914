// Matrix-vector unit from deq8, for formats without a whole-word decoder (its x,
// lib_mv_xrun.wgsl): unit u of a row is its elements 32u..32u+31 (every QK of these formats
// divides 32 or is a multiple of it).
const MV_UNIT: u32 = 32u;

// dot(row[i..i + 8], (a, b)); rb = the row's byte offset.
fn mv_gen8(rb: u32, i: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let w = deq8(rb + (i / QK) * BLOCK_BYTES, i % QK);
    return dot(w.a, a) + dot(w.b, b);
}

// dot(row[32u..32u+32], x[32u..32u+32]).
fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let i = 32u * u;
    return mv_gen8(rb, i, x.a[0], x.a[1]) + mv_gen8(rb, i + 8u, x.a[2], x.a[3]) + mv_gen8(rb, i + 16u, x.b[0], x.b[1])
        + mv_gen8(rb, i + 24u, x.b[2], x.b[3]);
}
