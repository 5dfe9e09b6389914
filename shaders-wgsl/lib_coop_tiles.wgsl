// Shared by matmul_coop.wgsl and matmul_coop_emu.wgsl (the f16-input prefill kernels): the same
// TILE_M x TILE_N x TILE_K tiling as matmul_tiled.wgsl, with both operand tiles rounded to f16 in
// workgroup memory, row-major so that cooperative-matrix loads read them with coopLoadT:
//   ws16[r][k] (stride TILE_K): A = the weights, rows x k;
//   xs16[k][t] (stride TILE_N): B = x transposed, k x tokens;
//   cs[r][t] (stride CS): the f32 results, stored once at the end and written out in the output's
//   order (CS = TILE_N + 4: cooperative loads and stores need strides of whole 16 bytes).
// Uses the kernel's P, X, out and the format's deq8.
const CS: u32 = COOP_CS;

var<workgroup> ws16: array<f16, TILE_M * TILE_K>;
var<workgroup> xs16: array<f16, TILE_K * TILE_N>;
var<workgroup> cs: array<f32, TILE_M * COOP_CS>;

fn coop_zero_c(li: u32) {
    for (var i = li; i < TILE_M * CS; i += COOP_WG) {
        cs[i] = 0.0;
    }
}

// Stage the k step at k0: 256 units of 8 weights and 256 units of 8 x values, two of each per
// invocation. Rows past the piece and tokens past the batch stage zeros.
fn coop_stage(li: u32, k0: u32, r_base: u32, t_base: u32) {
    for (var j = 0u; j < 2u; j++) {
        let id = li + j * COOP_WG;
        let rt = id % 64u;
        let k8 = 8u * (id / 64u);
        let e = k0 + k8;
        var w = Deq8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (r_base + rt < P.rows) {
            w = deq8((r_base + rt) * P.row_bytes + (e / QK) * BLOCK_BYTES, e % QK);
        }
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        let tok = t_base + rt;
        if (tok < P.n_tok) {
            let xi = tok * (P.n_in / 4u) + e / 4u;
            xa = X[xi];
            xb = X[xi + 1u];
        }
        for (var i = 0u; i < 4u; i++) {
            ws16[rt * TILE_K + k8 + i] = f16(w.a[i]);
            ws16[rt * TILE_K + k8 + 4u + i] = f16(w.b[i]);
            xs16[(k8 + i) * TILE_N + rt] = f16(xa[i]);
            xs16[(k8 + 4u + i) * TILE_N + rt] = f16(xb[i]);
        }
    }
}

// out[t_base + t][row0 + r_base + r] = cs[r][t] for the rows and tokens in range.
fn coop_store_out(li: u32, r_base: u32, t_base: u32) {
    for (var i = li; i < TILE_M * TILE_N; i += COOP_WG) {
        let t = i / TILE_M;
        let r = i % TILE_M;
        if (t_base + t < P.n_tok && r_base + r < P.rows) {
            out[(t_base + t) * P.n_out + P.row0 + r_base + r] = cs[r * CS + t];
        }
    }
}
