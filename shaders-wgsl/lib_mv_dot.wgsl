// The x of the packed-integer-dot matrix-vector units (RILL_WGPU_MV_DOT, caps.rs; mv_q4_k_dot.wgsl,
// mv_q6_k_dot.wgsl): 64 elements as four segments of 16, each half of a 32-element block that
// mv_dot_prep.wgsl quantized into three int8 planes under a power-of-two scale s. A segment's
// 16 quants (small non-negative integers packed one per byte, valid int8) against each plane are
// four dot4I8Packed each (native OpSDot where the device has VK_KHR_shader_integer_dot_product),
// the i32 sums exact; the segment's dot is s (A + B / 254 + C / 254^2), combined in i32 as far as
// the quants' range allows: a few operations per 16 weights instead of a decode and an fma per
// weight.
const MV_UNIT: u32 = 64u;
const INV254: f32 = 1.0 / 254.0;

// One segment's three planes, four words each.
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
    // Each segment's block scale and its sum of x (f32, as the f32 units sum it).
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

// Segments a..d: half h of the blocks blk (within the token's x) of the token whose f32 x
// starts at vec4 xb (n_in / 4 per token, so its first quantized block is xb / 8).
fn mv_xq_unit(xb: u32, blk: vec4<u32>, h: u32) -> MvX {
    let o = XQ_VEC4 * (vec4<u32>(xb / 8u) + blk);
    let m0 = xq(o.x + 6u);
    let m1 = xq(o.y + 6u);
    let m2 = xq(o.z + 6u);
    let m3 = xq(o.w + 6u);
    let s = bitcast<vec4<f32>>(vec4<u32>(m0.x, m1.x, m2.x, m3.x));
    let sum = bitcast<vec4<f32>>(select(vec4<u32>(m0.y, m1.y, m2.y, m3.y), vec4<u32>(m0.z, m1.z, m2.z, m3.z), h == 1u));
    return MvX(mv_xq_seg(o.x + h), mv_xq_seg(o.y + h), mv_xq_seg(o.z + h), mv_xq_seg(o.w + h), s, sum);
}

// sum(q * plane) over 16 elements.
fn dot16(q: vec4<u32>, p: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, p.x) + dot4I8Packed(q.y, p.y) + dot4I8Packed(q.z, p.z) + dot4I8Packed(q.w, p.w);
}

// sum(q * x) / s over a segment of quants q <= 15 (Q4_K): the three plane sums meet in one
// i32, exactly (|dot16| <= 16 * 15 * 127 = 30480, and 30480 * (254^2 + 254 + 1) < 2^31), so a
// segment costs one conversion to f32 where it cost three. The conversion rounds once, as the
// f32 sum of the planes' terms did; scaling by 254^-2 before s keeps the result's range that of
// x / s (no overflow or underflow that x itself does not have).
fn dq_seg15(q: vec4<u32>, x: MvXSeg) -> f32 {
    return f32((dot16(q, x.a) * 254 + dot16(q, x.b)) * 254 + dot16(q, x.c)) * (INV254 * INV254);
}

// The same for any int8 quants (Q6_K's q <= 63): each plane's sum converted on its own. Combining
// planes a and b in i32 (|.| < 2^25) measured no faster for Q6_K on the H200 (examples/mv_bench).
fn dq_seg63(q: vec4<u32>, x: MvXSeg) -> f32 {
    return fma(fma(f32(dot16(q, x.c)), INV254, f32(dot16(q, x.b))), INV254, f32(dot16(q, x.a)));
}

// sum(q * x) of the four segments, q <= 15.
fn dq_unit15(qa: vec4<u32>, qb: vec4<u32>, qc: vec4<u32>, qd: vec4<u32>, x: MvX) -> vec4<f32> {
    return x.s * vec4<f32>(dq_seg15(qa, x.a), dq_seg15(qb, x.b), dq_seg15(qc, x.c), dq_seg15(qd, x.d));
}

// sum(q * x) of the four segments, q <= 63.
fn dq_unit63(qa: vec4<u32>, qb: vec4<u32>, qc: vec4<u32>, qd: vec4<u32>, x: MvX) -> vec4<f32> {
    return x.s * vec4<f32>(dq_seg63(qa, x.a), dq_seg63(qb, x.b), dq_seg63(qc, x.c), dq_seg63(qd, x.d));
}
