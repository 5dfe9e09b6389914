// F16 matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x).
const MV_UNIT: u32 = 8u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let w = f16x8(wq((rb >> 4u) + u));
    return dot(w.a, xv(xb + 2u * u)) + dot(w.b, xv(xb + 2u * u + 1u));
}
