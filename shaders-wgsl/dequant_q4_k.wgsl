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

fn deq8(bb: u32, i0: u32) -> Deq8 {
    let h = wq(bb >> 4u);
    let d = f16x2(h.x);
    let j = i0 >> 5u;
    let sm = kq_scale_min(j, h.yzw);
    let dl = d.x * f32(sm.x);
    let ml = d.y * f32(sm.y);
    let w = (bb + 16u + 32u * (j >> 1u) + (i0 & 31u)) >> 2u;
    let hi = j & 1u;
    return Deq8(dl * nib4(w32(w), hi) - ml, dl * nib4(w32(w + 1u), hi) - ml);
}
