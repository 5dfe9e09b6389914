// F16 and BF16 matrix-vector unit (its x, lib_mv_xrun.wgsl): 8 elements, one vec4 of 16-bit
// values decoded by the format's half8.
const MV_UNIT: u32 = 8u;

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let w = half8(wq((rb >> 4u) + u));
    return dot(w.a, x.a[0]) + dot(w.b, x.a[1]);
}
