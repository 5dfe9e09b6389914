// Q8_0 matrix-vector unit (its x, lib_mv_xrun.wgsl): two blocks (64 elements, 68 bytes). Rows
// of an even number of 34-byte blocks start on a word, and so does every pair: the pair's 17
// words are its 5 aligned vec4s shifted by whole words. Block 0 is its f16 d (low half of word
// 0) and quants at byte 2 (words shifted by a half word), block 1 its d in the high half of word
// 8 and quants in words 9..16.
const MV_UNIT: u32 = 64u;

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let o = rb + 68u * u;
    let i = o >> 4u;
    let s1 = (o & 4u) != 0u;
    let s2 = (o & 8u) != 0u;
    let c4 = wq(i + 4u);
    let w0 = realign4(wq(i), wq(i + 1u), s1, s2);
    let w1 = realign4(wq(i + 1u), wq(i + 2u), s1, s2);
    let w2 = realign4(wq(i + 2u), wq(i + 3u), s1, s2);
    let w3 = realign4(wq(i + 3u), c4, s1, s2);
    let w16 = realign4(c4, c4, s1, s2).x;
    let a = mv_sseg(half_shift(w0, w1.x), x.a) + mv_sseg(half_shift(w1, w2.x), x.b);
    let b = mv_sseg(vec4<u32>(w2.yzw, w3.x), x.c) + mv_sseg(vec4<u32>(w3.yzw, w16), x.d);
    return f16_to_f32(w0.x & 0xffffu) * a + f16_to_f32(w2.x >> 16u) * b;
}
