// The x of a matrix-vector unit of MV_UNIT consecutive elements (formats whose unit u is
// elements MV_UNIT * u .. + MV_UNIT of a row: the plain floats, 8; the generic decoder, 32;
// Q8_0, 64), loaded once for all the rows of an invocation: segments of 16 (a, b, c, d), or for
// 8 elements the first two columns of a. Fields a unit does not cover are zeros it never reads.
struct MvX {
    a: mat4x4<f32>,
    b: mat4x4<f32>,
    c: mat4x4<f32>,
    d: mat4x4<f32>,
}

fn mv_x(u: u32, xb: u32) -> MvX {
    let i = xb + (MV_UNIT / 4u) * u;
    let z = mat4x4<f32>();
    if (MV_UNIT == 8u) {
        return MvX(mat4x4<f32>(xv(i), xv(i + 1u), vec4<f32>(0.0), vec4<f32>(0.0)), z, z, z);
    }
    if (MV_UNIT == 32u) {
        return MvX(mv_xseg(i), mv_xseg(i + 4u), z, z);
    }
    return MvX(mv_xseg(i), mv_xseg(i + 4u), mv_xseg(i + 8u), mv_xseg(i + 12u));
}
