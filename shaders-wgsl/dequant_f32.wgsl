// F32 weights: one 4-byte element per "block" (also used for DType::F32 tensors, same layout).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn deq(block_byte: u32, i: u32) -> f32 {
    // Rows of f32 are always word aligned.
    return bitcast<f32>(W[block_byte >> 2u]);
}
