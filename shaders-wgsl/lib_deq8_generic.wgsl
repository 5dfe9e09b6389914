// deq8 from the format's per-element deq: elements i0..i0+7 of the block at bb (i0 % 8 == 0).
// For one-element blocks (QK = 1) the eight elements are the blocks at bb, bb + BLOCK_BYTES, ...
fn deq_at(bb: u32, i: u32) -> f32 {
    if (QK == 1u) {
        return deq(bb + i * BLOCK_BYTES, 0u);
    }
    return deq(bb, i);
}

fn deq8(bb: u32, i0: u32) -> Deq8 {
    return Deq8(vec4<f32>(deq_at(bb, i0), deq_at(bb, i0 + 1u), deq_at(bb, i0 + 2u), deq_at(bb, i0 + 3u)),
                vec4<f32>(deq_at(bb, i0 + 4u), deq_at(bb, i0 + 5u), deq_at(bb, i0 + 6u), deq_at(bb, i0 + 7u)));
}
