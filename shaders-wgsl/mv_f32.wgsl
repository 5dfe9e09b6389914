// F32 matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x).
// 8 elements per unit (rows are a multiple of 8 elements, so 32-byte aligned).
const MV_UNIT: u32 = 8u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let q = (rb >> 4u) + 2u * u;
    return dot(bitcast<vec4<f32>>(wq(q)), xv(xb + 2u * u)) + dot(bitcast<vec4<f32>>(wq(q + 1u)), xv(xb + 2u * u + 1u));
}
