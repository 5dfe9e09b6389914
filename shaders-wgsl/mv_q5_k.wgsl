// Q5_K matrix-vector unit (mv_kquant.wgsl): 176-byte blocks of 11 vec4s, the 32 qh bytes in
// vec4s 1 and 2 (bit j of qh[l] is the 5th bit of element l of sub-block j), quants from vec4 3.
fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    return kq_dot(rb, u, x, 11u, 3u, true);
}
