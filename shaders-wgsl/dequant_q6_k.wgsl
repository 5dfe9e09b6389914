// Q6_K (210 bytes / 256): 128 bytes ql (low nibbles), 64 bytes qh (2 high bits), 16 signed
// scale bytes, f16 d. Element i = 128h + 32k + l (k < 4, l < 32): low 4 bits from
// ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2), high 2 bits from bits 2k of
// qh[32h + l], scale i / 16. y = (d * sc) * (q - 32) (ggml's order).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte + 208u);
    let h = i >> 7u;
    let k = (i >> 5u) & 3u;
    let l = i & 31u;
    let lb = wbyte(block_byte + 64u * h + l + 32u * (k & 1u));
    let lo = select(lb & 0xfu, lb >> 4u, k >= 2u);
    let hi = (wbyte(block_byte + 128u + 32u * h + l) >> (2u * k)) & 3u;
    let q = i32(lo | (hi << 4u)) - 32;
    let sc = wi8(block_byte + 192u + (i >> 4u));
    return d * f32(sc) * f32(q);
}
