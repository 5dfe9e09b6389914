// Q4_K (144 bytes / 256): f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins
// (lib_kquant.wgsl), 128 bytes of nibbles. Element i = 64c + 32hi + l is nibble hi of
// qs[32c + l], in sub-block j = i / 32. y = (d * sc) * q - dmin * m (ggml's order).
// Rows are whole blocks of 144 = 9 * 16 bytes, so every block is 16-byte aligned.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let dmin = wf16(block_byte + 2u);
    let j = i >> 5u;
    let sm = kq_scale_min(j, kq_scales(block_byte));
    let dl = d * f32(sm.x);
    let ml = dmin * f32(sm.y);
    let b = wbyte(block_byte + 16u + 32u * (j >> 1u) + (i & 31u));
    let q = select(b & 0xfu, b >> 4u, (j & 1u) != 0u);
    return dl * f32(q) - ml;
}

// deq8 in two halves, so that a kernel can issue the loads early and decode later
// (lib_c2w_words.wgsl): a unit of 8 elements (i0 % 8 == 0) as loaded, the block's 16-byte header
// (d, dmin, the packed scales and mins) and the aligned 16 bytes holding its 8 quant bytes (blocks
// are 16-byte aligned, so the unit's bytes start 8-byte aligned), then its arithmetic.
struct Deq8Words {
    head: vec4<u32>,
    q: vec4<u32>,
    i0: u32,
}

fn deq8_load(bb: u32, i0: u32) -> Deq8Words {
    let qb = bb + 16u + 32u * (i0 >> 6u) + (i0 & 31u);
    return Deq8Words(wq(bb >> 4u), wq(qb >> 4u), i0);
}

fn deq8_words(w: Deq8Words) -> Deq8 {
    let d = f16x2(w.head.x);
    let j = w.i0 >> 5u;
    let sm = kq_scale_min(j, w.head.yzw);
    let dl = d.x * f32(sm.x);
    let ml = d.y * f32(sm.y);
    let hi = j & 1u;
    // Bytes 8..15 of the 16 when the unit's offset in its 32 bytes is 8 or 24.
    let second = (w.i0 & 8u) != 0u;
    let lo = dl * nib4(select(w.q.x, w.q.z, second), hi) - ml;
    return Deq8(lo, dl * nib4(select(w.q.y, w.q.w, second), hi) - ml);
}

fn deq8(bb: u32, i0: u32) -> Deq8 {
    return deq8_words(deq8_load(bb, i0));
}
