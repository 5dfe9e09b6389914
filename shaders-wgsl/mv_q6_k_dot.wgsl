// The Q6_K matrix-vector unit on packed integer dot products (lib_mv_dot.wgsl): mv_q6_k.wgsl's
// unit (quarter (h, t) of a block: 16 elements of each of the 32-element groups 4h + k, k < 4,
// which are blocks of x) with the unsigned 6-bit quants q (0..63); the -32 of each is
// sum((q - 32) x) = sum(q x) - 32 sum(x), the sum the prep's f32 segment sum.
fn mv_x(u: u32, xb: u32) -> MvX {
    let w = u & 3u;
    let b0 = 8u * (u >> 2u) + 4u * (w >> 1u);
    return mv_xq_unit(xb, vec4<u32>(b0) + vec4<u32>(0u, 1u, 2u, 3u), w & 1u);
}

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let q = q6_unit(rb, u);
    return q.scale * dot(q.sc, fma(vec4<f32>(-32.0), x.sum, dq_unit63(q.a, q.b, q.c, q.d, x)));
}
