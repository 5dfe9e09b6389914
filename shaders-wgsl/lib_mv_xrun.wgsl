// The x of a matrix-vector unit of MV_UNIT consecutive elements (formats whose unit u is
// elements MV_UNIT * u .. + MV_UNIT of a row: the plain floats, Q8_0, the generic decoder),
// loaded once for all the rows of an invocation.
struct MvX {
    v: array<vec4<f32>, MV_UNIT / 4u>,
}

fn mv_x(u: u32, xb: u32) -> MvX {
    var x: MvX;
    for (var i = 0u; i < MV_UNIT / 4u; i++) {
        x.v[i] = xv(xb + (MV_UNIT / 4u) * u + i);
    }
    return x;
}
