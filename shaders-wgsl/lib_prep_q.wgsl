// Query head `row` (= t * nh + h) of the attention preparation (lib_attn_prep.wgsl): q and gate
// split out of qg [T, nh * 2d] (per head [q | gate]), q normalised (q_norm) and rotated into
// q_normed, gate copied. The kernel declares qg, q_norm, gate and q_normed.
fn prep_q(row: u32, li: u32, lanes: Lanes) {
    let t = row / P.nh;
    let own = li < P.d;
    let j = min(li, P.d - 1u);
    let src = row * 2u * P.d + j;
    let y = prep_head(select(0.0, qg[src], own), q_norm[j], li, lanes, pos[0] + t);
    if (own) {
        let o = row * P.d + j;
        gate[o] = qg[src + P.d];
        q_normed[o] = y;
    }
}
