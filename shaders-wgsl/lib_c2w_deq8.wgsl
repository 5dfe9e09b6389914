// matmul_coop2's weight staging for the formats whose deq8 is not split into loads and arithmetic
// (lib_c2w_words.wgsl takes those): a unit of 8 weights is decoded (`deq8`) and rounded to f16 at
// the k step's fetch, and held as such until its put.
alias W8 = H8;

fn w8_load(bb: u32, i0: u32) -> W8 {
    let w = deq8(bb, i0);
    return H8(vec4<f16>(w.a), vec4<f16>(w.b));
}

fn w8_decode(w: W8) -> H8 {
    return w;
}
