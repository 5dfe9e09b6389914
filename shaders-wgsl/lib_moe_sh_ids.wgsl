// moe_swiglu_sh's experts: read from ids, which moe_route wrote.
@group(0) @binding(5) var<storage, read> ids: array<u32>;

// The expert of slot j of token t (n_exp for a slot past the last token or the shared slot).
fn sh_expert(g: u32, t: u32, j: u32, li: u32) -> u32 {
    if (t < P.n_tok && j < P.k) {
        return ids[t * P.k + j];
    }
    return P.n_exp;
}
