// matmul_coop2's weight staging for Q4_K: the k step's fetch only loads a unit's words (the
// block's 16-byte header, the 16 bytes that hold its 8 quant bytes), and the put decodes them
// after the step's products, as dequant_q4_k.wgsl's deq8 does. Decoded at the fetch, the
// arithmetic waited there for the loads every step (H200, 12288 x 4096 x 512: 622 -> 447 us).
struct W8 {
    head: vec4<u32>, // d, dmin, the packed scales and mins
    q: vec4<u32>,    // the aligned 16 bytes holding the unit's 8 quant bytes
    i0: u32,         // the unit's first element in its block
}

fn w8_load(bb: u32, i0: u32) -> W8 {
    let j = i0 >> 5u;
    // The unit's 8 bytes start 8-byte aligned (blocks are 16-byte aligned, i0 % 8 == 0).
    let qb = bb + 16u + 32u * (j >> 1u) + (i0 & 31u);
    return W8(wq(bb >> 4u), wq(qb >> 4u), i0);
}

fn w8_decode(w: W8) -> H8 {
    let d = f16x2(w.head.x);
    let j = w.i0 >> 5u;
    let sm = kq_scale_min(j, w.head.yzw);
    let dl = d.x * f32(sm.x);
    let ml = d.y * f32(sm.y);
    let hi = j & 1u;
    // Bytes 8..15 of the 16 when the unit's offset in its 32 bytes is 8 or 24.
    let second = (w.i0 & 8u) != 0u;
    let lo = dl * nib4(select(w.q.x, w.q.z, second), hi) - ml;
    let up = dl * nib4(select(w.q.y, w.q.w, second), hi) - ml;
    return H8(vec4<f16>(lo), vec4<f16>(up));
}
