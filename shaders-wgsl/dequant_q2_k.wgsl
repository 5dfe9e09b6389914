// Q2_K (84 bytes / 256): 16 scale bytes (low nibble: scale, high nibble: min of each
// 16-element sub-block), 64 bytes of 2-bit quants, f16 d, f16 dmin.
// Element i = 128h + 32s + 16half + l takes bits 2s..2s+1 of qs[32h + 16half + l] and the scale
// byte i / 16. y = (d * sc) * q - dmin * m (ggml's order).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte + 80u);
    let dmin = wf16(block_byte + 82u);
    let sc = wbyte(block_byte + (i >> 4u));
    let dl = d * f32(sc & 0xfu);
    let ml = dmin * f32(sc >> 4u);
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let q = (wbyte(block_byte + 16u + 32u * h + (i & 31u)) >> (2u * s)) & 3u;
    return dl * f32(q) - ml;
}
