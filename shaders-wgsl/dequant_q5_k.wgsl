// Q5_K (176 bytes / 256): f16 d, f16 dmin, 12 bytes of scales/mins (lib_kquant.wgsl), 32 bytes
// qh, 128 bytes of nibbles. Element i = 64c + 32hi + l is nibble hi of qs[32c + l] plus bit j of
// qh[l] as its 5th bit, j = i / 32 its sub-block. y = (d * sc) * q - dmin * m.
// Rows are whole blocks of 176 = 11 * 16 bytes, so every block is 16-byte aligned.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let dmin = wf16(block_byte + 2u);
    let j = i >> 5u;
    let l = i & 31u;
    let sm = kq_scale_min(j, kq_scales(block_byte));
    let dl = d * f32(sm.x);
    let ml = dmin * f32(sm.y);
    let b = wbyte(block_byte + 48u + 32u * (j >> 1u) + l);
    let h = ((wbyte(block_byte + 16u + l) >> j) & 1u) << 4u;
    let q = select(b & 0xfu, b >> 4u, (j & 1u) != 0u) | h;
    return dl * f32(q) - ml;
}

// The 5-bit quants of four elements: nibbles hi of word w, 5th bits = bit j of each byte of qh.
fn q5x4(w: u32, qh: u32, hi: u32, j: u32) -> vec4<f32> {
    return nib4(w, hi) + 16.0 * bytes_bit(qh, j);
}

fn deq8(bb: u32, i0: u32) -> Deq8 {
    let h = wq(bb >> 4u);
    let d = f16x2(h.x);
    let j = i0 >> 5u;
    let l = i0 & 31u;
    let sm = kq_scale_min(j, h.yzw);
    let dl = d.x * f32(sm.x);
    let ml = d.y * f32(sm.y);
    let w = (bb + 48u + 32u * (j >> 1u) + l) >> 2u;
    let qh = (bb + 16u + l) >> 2u;
    let hi = j & 1u;
    return Deq8(dl * q5x4(w32(w), w32(qh), hi, j) - ml, dl * q5x4(w32(w + 1u), w32(qh + 1u), hi, j) - ml);
}
