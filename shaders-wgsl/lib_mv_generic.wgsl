// Matrix-vector unit from deq8, for formats without a whole-word decoder (its x,
// lib_mv_xrun.wgsl): unit u of a row is its elements 32u..32u+31 (every QK of these formats
// divides 32 or is a multiple of it).
const MV_UNIT: u32 = 32u;

// dot(row[32u..32u+32], x[32u..32u+32]); rb = the row's byte offset.
fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    var acc = 0.0;
    for (var e = 0u; e < 4u; e++) {
        let i = 32u * u + 8u * e;
        let w = deq8(rb + (i / QK) * BLOCK_BYTES, i % QK);
        acc += dot(w.a, x.v[2u * e]) + dot(w.b, x.v[2u * e + 1u]);
    }
    return acc;
}
