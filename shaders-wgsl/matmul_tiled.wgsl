// out[t][row0 + r] = dot(W[r], x[t]) for a batch of tokens (prefill; lib_tile_io.wgsl): one workgroup computes a
// TILE_M x TILE_N block of (rows, tokens), stepping through the row TILE_K elements at a time.
// Each step dequantizes the block's weights once into workgroup memory (one deq8 per invocation)
// and stages the tokens' x, then every invocation updates its 4 x 4 outputs from the two tiles
// (register blocking: 2 vec4 loads per 16 multiply-adds). n_in is a multiple of TILE_K.
// [k][row / 4] and [k][token / 4] (8 KiB + 8 KiB).

var<workgroup> ws: array<vec4<f32>, TILE_K * TILE_M / 4u>;
var<workgroup> xs: array<vec4<f32>, TILE_K * TILE_N / 4u>;

fn store4(tok: u32, r: u32, c: vec4<f32>) {
    if (tok >= P.n_tok) {
        return;
    }
    let o = tok * P.n_out + P.row0 + r;
    for (var i = 0u; i < 4u; i++) {
        if (r + i < P.rows) {
            out[o + i] = c[i];
        }
    }
}

@compute @workgroup_size(TILE_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tile = linear_wg(wg, nwg);
    let r_base = (tile % P.row_tiles) * TILE_M;
    let t_base = (tile / P.row_tiles) * TILE_N;
    if (t_base >= P.n_tok) {
        return;
    }
    // Staging roles: row / token li % 64, elements 8 * (li / 64) .. + 8 of the k step.
    let sr = li % 64u;
    let sk = 8u * (li / 64u);
    let w_row = r_base + sr;
    let w_ok = w_row < P.rows;
    let rb = w_row * P.row_bytes;
    let x_tok = t_base + sr;
    let x_ok = x_tok < P.n_tok;
    let xb = x_tok * (P.n_in / 4u);
    // Compute roles: rows 4 * ty.., tokens 4 * tx..
    let tx = li % 16u;
    let ty = li / 16u;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < P.n_in; k0 += TILE_K) {
        var w = Deq8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (w_ok) {
            let e = k0 + sk;
            w = deq8(rb + (e / QK) * BLOCK_BYTES, e % QK);
        }
        var xa = vec4<f32>(0.0);
        var xb8 = vec4<f32>(0.0);
        if (x_ok) {
            xa = X[xb + (k0 + sk) / 4u];
            xb8 = X[xb + (k0 + sk) / 4u + 1u];
        }
        // The previous step's readers are done before the tiles are overwritten.
        workgroupBarrier();
        let wi = sk * 16u + sr / 4u;
        let wc = sr % 4u;
        for (var i = 0u; i < 4u; i++) {
            ws[wi + 16u * i][wc] = w.a[i];
            ws[wi + 16u * (i + 4u)][wc] = w.b[i];
            xs[wi + 16u * i][wc] = xa[i];
            xs[wi + 16u * (i + 4u)][wc] = xb8[i];
        }
        workgroupBarrier();
        for (var k = 0u; k < TILE_K; k++) {
            let a = ws[k * 16u + ty];
            let b = xs[k * 16u + tx];
            c0 += a * b.x;
            c1 += a * b.y;
            c2 += a * b.z;
            c3 += a * b.w;
        }
    }
    let r = r_base + 4u * ty;
    let t = t_base + 4u * tx;
    store4(t, r, c0);
    store4(t + 1u, r, c1);
    store4(t + 2u, r, c2);
    store4(t + 3u, r, c3);
}
