// Byte access into a weight buffer `W: array<u32>` (declared by the op shader), prepended to every
// weight-format variant before its `dequant_<type>.wgsl`. GGUF blocks are not word aligned
// (e.g. Q4_0 is 18 bytes), so everything is addressed in bytes.

fn wbyte(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

// A signed byte.
fn wi8(b: u32) -> i32 {
    return (i32(wbyte(b)) << 24u) >> 24u;
}

// A little-endian u16 at an even byte offset.
fn wu16(b: u32) -> u32 {
    let w = W[b >> 2u];
    return select(w & 0xffffu, w >> 16u, (b & 2u) != 0u);
}

// A little-endian f16 at an even byte offset.
fn wf16(b: u32) -> f32 {
    return f16_to_f32(wu16(b));
}

// A little-endian u32 at any byte offset.
fn wu32(b: u32) -> u32 {
    return wbyte(b) | (wbyte(b + 1u) << 8u) | (wbyte(b + 2u) << 16u) | (wbyte(b + 3u) << 24u);
}
