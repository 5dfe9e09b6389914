// F32 matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x): 8
// elements per unit (rows are a multiple of 8 elements, so 32-byte aligned), for 4 rows at
// once so the unit's x is loaded once.
const MV_UNIT: u32 = 8u;

fn f32_dot8(q: u32, xa: vec4<f32>, xc: vec4<f32>) -> f32 {
    return dot(bitcast<vec4<f32>>(wq(q)), xa) + dot(bitcast<vec4<f32>>(wq(q + 1u)), xc);
}

// Unit u of the 4 rows at byte offsets rb; xb = the vec4 index of x[0].
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    let q = (rb >> vec4<u32>(4u)) + vec4<u32>(2u * u);
    let xa = xv(xb + 2u * u);
    let xc = xv(xb + 2u * u + 1u);
    return vec4<f32>(f32_dot8(q.x, xa, xc), f32_dot8(q.y, xa, xc), f32_dot8(q.z, xa, xc), f32_dot8(q.w, xa, xc));
}
