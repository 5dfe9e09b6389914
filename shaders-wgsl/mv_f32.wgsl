// F32 matrix-vector unit (its x, lib_mv_xrun.wgsl): 8 elements (rows are a multiple of 8
// elements, so 32-byte aligned).
const MV_UNIT: u32 = 8u;

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let q = (rb >> 4u) + 2u * u;
    return dot(bitcast<vec4<f32>>(wq(q)), x.a[0]) + dot(bitcast<vec4<f32>>(wq(q + 1u)), x.a[1]);
}
