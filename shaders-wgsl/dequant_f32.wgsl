// F32 weights: one 4-byte element per "block" (also used for DType::F32 tensors, same layout).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn deq(block_byte: u32, i: u32) -> f32 {
    // Rows of f32 are always word aligned.
    return bitcast<f32>(w32(block_byte >> 2u));
}

// Elements at bb .. bb + 32 (32-byte aligned: rows are a multiple of 8 elements).
fn deq8(bb: u32, i0: u32) -> Deq8 {
    let q = bb >> 4u;
    return Deq8(bitcast<vec4<f32>>(wq(q)), bitcast<vec4<f32>>(wq(q + 1u)));
}
