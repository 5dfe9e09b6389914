// Matrix-vector unit from deq8, for formats without a whole-word decoder: unit u of a row is its
// elements 32u..32u+31 (every QK of these formats divides 32 or is a multiple of it).
const MV_UNIT: u32 = 32u;

// dot(row[32u..32u+32], x[32u..32u+32]); rb = the row's byte offset, xb = the vec4 index of x[0].
fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    var acc = 0.0;
    for (var e = 0u; e < 32u; e += 8u) {
        let i = 32u * u + e;
        let w = deq8(rb + (i / QK) * BLOCK_BYTES, i % QK);
        acc += dot(w.a, xv(xb + i / 4u)) + dot(w.b, xv(xb + i / 4u + 1u));
    }
    return acc;
}

// Unit u of the 4 rows at byte offsets rb.
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    return vec4<f32>(mv_unit(rb.x, u, xb), mv_unit(rb.y, u, xb), mv_unit(rb.z, u, xb), mv_unit(rb.w, u, xb));
}
