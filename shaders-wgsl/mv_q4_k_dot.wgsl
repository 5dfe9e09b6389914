// The Q4_K matrix-vector unit on packed integer dot products (RILL_WGPU_MV_DOT, caps.rs): the
// unit of mv_kquant.wgsl (64 elements: 16 of each of sub-blocks 2c, 2c + 1, 2c + 4, 2c + 5), with
// x quantized by mv_dot_prep.wgsl into three int8 planes per 32-element block. A sub-block's 16
// nibbles (0..15, valid int8) against each plane are four dot4I8Packed each (native OpSDot where
// the device has VK_KHR_shader_integer_dot_product), the i32 sums exact; the segment's dot is
// s (A + B / 254 + C / 254^2) in f32: one fma chain per 16 weights instead of a decode and an
// fma per weight. The min term uses the prep's f32 segment sums, as the f32 unit does.
const MV_UNIT: u32 = 64u;
const INV254: f32 = 1.0 / 254.0;

// One 16-element segment's three planes, four words each.
struct MvXSeg {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
}

struct MvX {
    a: MvXSeg,
    b: MvXSeg,
    c: MvXSeg,
    d: MvXSeg,
    // Each segment's block scale and its sum of x.
    s: vec4<f32>,
    sum: vec4<f32>,
}

// Words i of the quantized x, bound where the matrix-vector kernels bind x (as f32; only bits
// move, no float operation touches them).
fn xq(i: u32) -> vec4<u32> {
    return bitcast<vec4<u32>>(xv(i));
}

fn mv_xq_seg(i: u32) -> MvXSeg {
    return MvXSeg(xq(i), xq(i + 2u), xq(i + 4u));
}

// xb: the token's first vec4 of the f32 x (n_in / 4 per token), so its first quantized block
// is xb / 8.
fn mv_x(u: u32, xb: u32) -> MvX {
    let v = u & 3u;
    let h = v & 1u;
    // Blocks of the segments: 2c and 2c + 1 of the unit's super-block, then 2c + 4, 2c + 5.
    let b0 = XQ_VEC4 * (xb / 8u + 8u * (u >> 2u) + 2u * (v >> 1u));
    let m0 = xq(b0 + 6u);
    let m1 = xq(b0 + XQ_VEC4 + 6u);
    let m4 = xq(b0 + 4u * XQ_VEC4 + 6u);
    let m5 = xq(b0 + 5u * XQ_VEC4 + 6u);
    let s = bitcast<vec4<f32>>(vec4<u32>(m0.x, m1.x, m4.x, m5.x));
    let sum = bitcast<vec4<f32>>(select(vec4<u32>(m0.y, m1.y, m4.y, m5.y), vec4<u32>(m0.z, m1.z, m4.z, m5.z), h == 1u));
    return MvX(mv_xq_seg(b0 + h), mv_xq_seg(b0 + XQ_VEC4 + h), mv_xq_seg(b0 + 4u * XQ_VEC4 + h),
               mv_xq_seg(b0 + 5u * XQ_VEC4 + h), s, sum);
}

// sum(q * plane) over 16 elements: q's bytes are nibbles (0..15), the plane's signed.
fn dot16(q: vec4<u32>, p: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, p.x) + dot4I8Packed(q.y, p.y) + dot4I8Packed(q.z, p.z) + dot4I8Packed(q.w, p.w);
}

// sum(q * x) / s over a segment: the i32 plane sums are exact (|sum| <= 16 * 15 * 127), their
// f32 conversions too.
fn dq_seg(q: vec4<u32>, x: MvXSeg) -> f32 {
    return fma(fma(f32(dot16(q, x.c)), INV254, f32(dot16(q, x.b))), INV254, f32(dot16(q, x.a)));
}

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let v = u & 3u;
    let c = v >> 1u;
    let q0 = (rb >> 4u) + 9u * (u >> 2u);
    let hd = wq(q0);
    let p = wq(q0 + 1u + v);
    let r = wq(q0 + 5u + v);
    let lo = vec4<u32>(0x0f0f0f0fu);
    let sq = x.s * vec4<f32>(dq_seg(p & lo, x.a), dq_seg((p >> vec4<u32>(4u)) & lo, x.b), dq_seg(r & lo, x.c),
                             dq_seg((r >> vec4<u32>(4u)) & lo, x.d));
    let sm = kq_unit_scales(hd, c);
    let dm = f16x2(hd.x);
    return dm.x * dot(bytes_f4(sm.x, 0.0), sq) - dm.y * dot(bytes_f4(sm.y, 0.0), x.sum);
}
