// The matrix-vector unit shared by Q4_K and Q5_K (mv_q4_k.wgsl, mv_q5_k.wgsl; matvec.wgsl and its
// relatives define xv(i), the i-th vec4 of x): 64 elements. Unit u of a row is parts v = u % 4
// and v + 4 of block u / 4, a part being 16 bytes of qs: for l = 16(v & 1) + [0, 16) and
// c = v / 2, part v holds elements 64c + l (sub-block 2c, low nibbles) and 64c + 32 + l
// (sub-block 2c + 1, high nibbles), part v + 4 the same in sub-blocks 2c + 4 and 2c + 5. Pairing
// sub-block j with j + 4 makes their packed 6-bit scales cheap: the high bits of j + 4's sit in
// j's bytes (ggml's get_scale_min_k4), so one half word of each scale word serves all four.
// Per row: d * sum_j sc_j * sum(q x) - dmin * sum_j m_j * sum(x) over the unit's 4 sub-blocks.
const MV_UNIT: u32 = 64u;

// The unit's x: segments a..d (sub-blocks 2c, 2c + 1, 2c + 4, 2c + 5, lib_mv_unit.wgsl) of 16
// elements each, and the sum of each segment; loaded once for all the rows of an invocation.
struct MvX {
    a: mat4x4<f32>,
    b: mat4x4<f32>,
    c: mat4x4<f32>,
    d: mat4x4<f32>,
    s: vec4<f32>,
}

fn mv_x(u: u32, xb: u32) -> MvX {
    let v = u & 3u;
    let x0 = xb + 64u * (u >> 2u) + 16u * (v >> 1u) + 4u * (v & 1u);
    // Segments start 0, 32, 128 and 160 elements after the first.
    let a = mv_xseg(x0);
    let b = mv_xseg(x0 + 8u);
    let c = mv_xseg(x0 + 32u);
    let d = mv_xseg(x0 + 40u);
    return MvX(a, b, c, d, vec4<f32>(mv_xsum(a), mv_xsum(b), mv_xsum(c), mv_xsum(d)));
}

// 16 quants of a part's words of nibbles (`hi` selects the high ones) with, for Q5_K, bit j of
// each byte of qh as their 5th bit; still packed one per byte.
fn kq_q4(w: vec4<u32>, hi: u32, qh: vec4<u32>, j: u32, five: bool) -> vec4<u32> {
    let q = (w >> vec4<u32>(4u * hi)) & vec4<u32>(0x0f0f0f0fu);
    if (five) {
        return q | (((qh >> vec4<u32>(j)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u));
    }
    return q;
}

// One row's unit; the block has `words` vec4s, its quants start at vec4 `qs_at` (the header is
// vec4 0, Q5_K's 32 qh bytes vec4s 1 and 2).
fn kq_dot(rb: u32, u: u32, x: MvX, words: u32, qs_at: u32, five: bool) -> f32 {
    let v = u & 3u;
    let c = v >> 1u;
    let q0 = (rb >> 4u) + words * (u >> 2u);
    let hd = wq(q0);
    let p = wq(q0 + qs_at + v);
    let r = wq(q0 + qs_at + 4u + v);
    var qh = vec4<u32>(0u);
    if (five) {
        qh = wq(q0 + 1u + (v & 1u));
    }
    let j = 2u * c;
    let sq = vec4<f32>(mv_seg(kq_q4(p, 0u, qh, j, five), 0.0, x.a), mv_seg(kq_q4(p, 1u, qh, j + 1u, five), 0.0, x.b),
                       mv_seg(kq_q4(r, 0u, qh, j + 4u, five), 0.0, x.c), mv_seg(kq_q4(r, 1u, qh, j + 5u, five), 0.0, x.d));
    let sm = kq_unit_scales(hd, c);
    let dm = f16x2(hd.x);
    return dm.x * dot(bytes_f4(sm.x, 0.0), sq) - dm.y * dot(bytes_f4(sm.y, 0.0), x.s);
}
