// Q4_K matrix-vector unit (mv_kquant.wgsl): 144-byte blocks of 9 vec4s, quants from vec4 1.
fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    return kq_dot(rb, u, x, 9u, 1u, false);
}
