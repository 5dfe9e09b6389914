// One token of the gated delta rule on one value head's state rows (spec/DELTANET.md A.2, the
// update delta_rule_recurrent.wgsl describes), shared by the one-sequence kernel and the kernel of
// steps of many sequences (delta_rule_rows.wgsl). Both declare the bindings it reads: `P` (hk, hv,
// dk, dv, conv_dim), `u`, `g`, `beta`, `state` and `out`.

// The rows of its block an invocation works on (first, first + step, ... below DELTA_REC_ROWS)
// and its place in a row (elements lane, lane + width, ...); from the row-group library.
struct RowGroup {
    first: u32,
    step: u32,
    lane: u32,
    width: u32,
}

// Token `t` (row t of u, g, beta and out) of value head `j` on the state rows of block `block`,
// the head's first state row at `head` (rows of dk values). Every invocation of the workgroup
// calls it with the same arguments (the row sums may synchronize the workgroup).
fn delta_token(t: u32, j: u32, head: u32, block: u32, li: u32, lanes: Lanes) {
    let dk = P.dk;
    let kh = j % P.hk; // key head of value head j (tiled rule)
    let key_dim = P.hk * dk;
    let grp = row_group(li, lanes);
    let iters = row_iters(lanes);
    let base = t * P.conv_dim;
    let q_at = base + kh * dk;
    let k_at = base + key_dim + kh * dk;
    let decay = exp(g[t * P.hv + j]);
    let b = beta[t * P.hv + j];
    for (var it = 0u; it < iters; it++) {
        let r = grp.first + it * grp.step; // row slot within the block
        let c = block * DELTA_REC_ROWS + r; // the state row
        let live = r < DELTA_REC_ROWS && c < P.dv;
        let row = (head + c) * dk;
        var kv = 0.0;
        if (live) {
            for (var i = grp.lane; i < dk; i += grp.width) {
                kv += state[row + i] * u[k_at + i];
            }
        }
        kv = row_sum(kv, li, lanes);
        var o = 0.0;
        if (live) {
            let delta = b * (u[base + 2u * key_dim + j * P.dv + c] - decay * kv);
            for (var i = grp.lane; i < dk; i += grp.width) {
                let m = decay * state[row + i] + delta * u[k_at + i];
                state[row + i] = m;
                o += m * u[q_at + i];
            }
        }
        o = row_sum(o, li, lanes);
        if (live && grp.lane == 0u) {
            out[(t * P.hv + j) * P.dv + c] = o;
        }
    }
}
