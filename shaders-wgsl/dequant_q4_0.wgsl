// Q4_0 (18 bytes / 32): f16 d, then 16 bytes of nibbles. Element j < 16 is the low nibble of
// byte j, element j + 16 its high nibble. y = (q - 8) * d.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let b = wbyte(block_byte + 2u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u);
    return f32(i32(q) - 8) * d;
}
