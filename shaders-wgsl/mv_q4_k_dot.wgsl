// The Q4_K matrix-vector unit on packed integer dot products (lib_mv_dot.wgsl): mv_kquant.wgsl's
// unit (16 elements of each of sub-blocks 2c, 2c + 1, 2c + 4, 2c + 5; the 32-element blocks of
// x are the sub-blocks) with nibbles 0..15 as the quants. The min term takes the prep's f32
// segment sums, as the f32 unit does.
fn mv_x(u: u32, xb: u32) -> MvX {
    let v = u & 3u;
    let b0 = 8u * (u >> 2u) + 2u * (v >> 1u);
    return mv_xq_unit(xb, vec4<u32>(b0) + vec4<u32>(0u, 1u, 4u, 5u), v & 1u);
}

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let v = u & 3u;
    let q0 = (rb >> 4u) + 9u * (u >> 2u);
    let hd = wq(q0);
    let p = wq(q0 + 1u + v);
    let r = wq(q0 + 5u + v);
    let lo = vec4<u32>(0x0f0f0f0fu);
    let four = vec4<u32>(4u);
    let sq = dq_unit15(p & lo, (p >> four) & lo, r & lo, (r >> four) & lo, x);
    let sm = kq_unit_scales(hd, v >> 1u);
    let dm = f16x2(hd.x);
    return dm.x * dot(bytes_f4(sm.x, 0.0), sq) - dm.y * dot(bytes_f4(sm.y, 0.0), x.sum);
}
