// Q8_0 matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x).
// One whole block per unit.
const MV_UNIT: u32 = 32u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let bb = rb + u * BLOCK_BYTES;
    let q = bb + 2u;
    let x = xb + 8u * u;
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s += dot(i8x4(wu32e(q + 4u * k)), xv(x + k));
    }
    return s * wf16(bb);
}
