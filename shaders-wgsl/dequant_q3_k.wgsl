// Q3_K (110 bytes / 256): 32 bytes hmask, 64 bytes of 2-bit quants, 12 bytes of packed 6-bit
// signed scales, f16 d. Element i = 128h + 32s + ll (ll < 32) takes bits 2s..2s+1 of
// qs[32h + ll] and subtracts 4 unless bit 4h + s of hmask[ll] is set; sub-block k = i / 16 has
// scale (low 4 bits | high 2 bits << 4) - 32. y = (d * scale) * q.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte + 108u);
    let k = i >> 4u;
    let sb = block_byte + 96u;
    // Scales 0..7 are the low nibbles of bytes 0..7, scales 8..15 their high nibbles.
    let lb = wbyte(sb + (k & 7u));
    let low4 = select(lb & 0xfu, lb >> 4u, k >= 8u);
    let high2 = (wbyte(sb + 8u + (k & 3u)) >> (2u * (k >> 2u))) & 3u;
    let dl = d * f32(i32(low4 | (high2 << 4u)) - 32);
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let ll = i & 31u;
    let q2 = i32((wbyte(block_byte + 32u + 32u * h + ll) >> (2u * s)) & 3u);
    let bit = 1u << (4u * h + s);
    let q = q2 - select(4, 0, (wbyte(block_byte + ll) & bit) != 0u);
    return dl * f32(q);
}
