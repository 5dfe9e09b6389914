// matmul_coop2's weight staging for the formats whose dequant file splits deq8 into its loads
// (deq8_load) and its arithmetic (deq8_words): Q4_K and Q6_K. The k step's fetch only loads a
// unit's words and the put decodes them, after the step's products: decoded next to its loads,
// every step waited on them (H200, 12288 x 4096 x 512 Q4_K: 622 -> 447 us).
alias W8 = Deq8Words;

fn w8_load(bb: u32, i0: u32) -> W8 {
    return deq8_load(bb, i0);
}

fn w8_decode(w: W8) -> H8 {
    let d = deq8_words(w);
    return H8(vec4<f16>(d.a), vec4<f16>(d.b));
}
