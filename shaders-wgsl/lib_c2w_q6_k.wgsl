// matmul_coop2's weight staging for Q6_K: the k step's fetch only loads a unit's words (d, its
// scale byte, the 8 ql and 8 qh bytes, each run as the three words that hold it: blocks start on
// any even byte), and the put decodes them after the step's products, as dequant_q6_k.wgsl's
// deq8 does (see lib_c2w_q4_k.wgsl for why).
struct W8 {
    d: u32,      // the word holding d
    sc: u32,     // the word holding the unit's scale byte
    ql: vec3<u32>,
    qh: vec3<u32>,
    bb: u32,     // the block's first byte (its half-word parity places d, ql and qh)
    i0: u32,     // the unit's first element in its block
}

fn w8_load(bb: u32, i0: u32) -> W8 {
    let h = i0 >> 7u;
    let k = (i0 >> 5u) & 3u;
    let l = i0 & 31u;
    let ql = (bb + 64u * h + l + 32u * (k & 1u)) >> 2u;
    let qh = (bb + 128u + 32u * h + l) >> 2u;
    return W8(w32((bb + 208u) >> 2u), w32((bb + 192u + (i0 >> 4u)) >> 2u),
              vec3<u32>(w32(ql), w32(ql + 1u), w32(ql + 2u)),
              vec3<u32>(w32(qh), w32(qh + 1u), w32(qh + 2u)), bb, i0);
}

// Words 0 and 1 of the 8 bytes at a half-word offset odd (the run's first byte is byte 2 of v.x)
// or not.
fn q6w_pair(v: vec3<u32>, odd: bool) -> vec2<u32> {
    return select(v.xy, vec2<u32>((v.x >> 16u) | (v.y << 16u), (v.y >> 16u) | (v.z << 16u)), odd);
}

fn w8_decode(w: W8) -> H8 {
    // ql, qh and d sit at the block's parity (their offsets in it are multiples of 4).
    let odd = (w.bb & 2u) != 0u;
    let k = (w.i0 >> 5u) & 3u;
    let d = f16_to_f32(select(w.d & 0xffffu, w.d >> 16u, odd));
    let sb = w.bb + 192u + (w.i0 >> 4u);
    let sc = (i32((w.sc >> (8u * (sb & 3u))) & 0xffu) << 24u) >> 24u;
    let dsc = d * f32(sc);
    let ql = q6w_pair(w.ql, odd);
    let qh = q6w_pair(w.qh, odd);
    return H8(vec4<f16>(dsc * q6x4(ql.x, qh.x, k)), vec4<f16>(dsc * q6x4(ql.y, qh.y, k)));
}
