// Q8_0 (34 bytes / 32): f16 d, 32 signed bytes. y = q * d.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    return f32(wi8(block_byte + 2u + i)) * d;
}

// Blocks start at even bytes only (34 per block): the quant words are read with wu32e.
fn deq8(bb: u32, i0: u32) -> Deq8 {
    let d = wf16(bb);
    let q = bb + 2u + i0;
    return Deq8(i8x4(wu32e(q)) * d, i8x4(wu32e(q + 4u)) * d);
}
