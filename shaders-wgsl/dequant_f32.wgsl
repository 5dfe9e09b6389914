// F32 weights: one value per 4-byte "block".
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn deq(block_byte: u32, i: u32) -> f32 {
    return bitcast<f32>(W[block_byte >> 2u]);
}
