// Chunked gated delta rule, part 2 (spec/DELTANET.md B.3 in the value-major layout M = Sᵀ):
// the sequential pass over the chunks of a batch, using the scratch of delta_rule_chunk_prep.
//
// Row-owned like the recurrent kernel: one workgroup per (value head j, block of DELTA_ROWS state rows),
// invocation c owns row M_c (private, loaded once, stored once). Row c of B.3 is
//   vn[r]   = U[r][c] − W_r · M_c                          (V_newᵀ = Uᵀ − M Wᵀ, row c)
//   O[r][c] = e^{γ_r} (q_r · M_c) + Σ_{s≤r} P[r][s] vn[s]  ((Q⊙e^γ) Mᵀ + P V_new, column c)
//   M_c     ← e^{γ_last} M_c + Σ_r vn[r] · (k_r e^{γ_last−γ_r})
// where M_c is the row at the chunk start in the first two lines. Everything any row needs from
// other rows is a broadcast vector (W_r, q_r, k_r), staged in workgroup memory per token.
// vn[r] overwrites U[r][c] in the scratch: only this invocation ever reads that element.
// One dispatch runs chunks n_first .. n_first + n_count of the batch (the host keeps n_count
// small: llvmpipe/lavapipe silently ends every loop of a shader invocation after 65535
// back-edges in total, and one chunk costs ~DELTA_CHUNK·(2·dk + DELTA_CHUNK/2) of them here).


struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    conv_dim: u32,
    t0: u32,
    n_tok: u32,
    nb: u32,
    n_first: u32, // chunks of the batch handled by this dispatch
    n_count: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;              // [T, conv_dim]
@group(0) @binding(2) var<storage, read_write> state: array<f32>;    // [Hv, dv, dk]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;      // [T, Hv*dv]
@group(0) @binding(4) var<storage, read> p_mat: array<f32>;          // [Hv, nb, DELTA_CHUNK, DELTA_CHUNK]
@group(0) @binding(5) var<storage, read_write> x_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, dv + dk]
@group(0) @binding(6) var<storage, read> dec: array<f32>;            // [Hv, nb, 2, DELTA_CHUNK]

var<workgroup> a_sh: array<f32, DELTA_MAX_DK>; // W_r (pass 1), k_r e^{γ_last−γ_r} (pass 2)
var<workgroup> q_sh: array<f32, DELTA_MAX_DK>;

@compute @workgroup_size(DELTA_ROWS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let j = wg.y;
    let c = wg.x * DELTA_ROWS + li;
    let owns_row = c < P.dv; // inactive invocations still take part in the barriers
    let dk = P.dk;
    let dv = P.dv;
    let kh = j % P.hk;
    let key_dim = P.hk * dk;
    let q_off = kh * dk;
    let k_off = key_dim + kh * dk;
    let xw = dv + dk;
    let row = (j * dv + c) * dk;

    var m: array<f32, DELTA_MAX_DK>;
    if (owns_row) {
        for (var i = 0u; i < dk; i++) {
            m[i] = state[row + i];
        }
    }

    for (var n = P.n_first; n < P.n_first + P.n_count; n++) {
        let tc = P.t0 + n * DELTA_CHUNK;
        let len = min(DELTA_CHUNK, P.n_tok - n * DELTA_CHUNK);
        let blk = j * P.nb + n;
        let mat = blk * DELTA_CHUNK * DELTA_CHUNK;
        let xb = blk * DELTA_CHUNK * xw;
        let db = blk * 2u * DELTA_CHUNK;

        // Pass 1: V_new and the outputs, both from the state at the chunk start.
        for (var r = 0u; r < len; r++) {
            workgroupBarrier();
            for (var i = li; i < dk; i += DELTA_ROWS) {
                a_sh[i] = x_mat[xb + r * xw + dv + i];
                q_sh[i] = u[(tc + r) * P.conv_dim + q_off + i];
            }
            workgroupBarrier();
            if (owns_row) {
                var wm = 0.0;
                var qm = 0.0;
                for (var i = 0u; i < dk; i++) {
                    wm += a_sh[i] * m[i];
                    qm += q_sh[i] * m[i];
                }
                let vn = x_mat[xb + r * xw + c] - wm;
                x_mat[xb + r * xw + c] = vn;
                var intra = 0.0;
                for (var s = 0u; s < r; s++) {
                    intra += p_mat[mat + r * DELTA_CHUNK + s] * x_mat[xb + s * xw + c];
                }
                intra += p_mat[mat + r * DELTA_CHUNK + r] * vn;
                out[((tc + r) * P.hv + j) * dv + c] = dec[db + r] * qm + intra;
            }
        }

        // Pass 2: M_c ← e^{γ_last} M_c + Σ_r vn[r] · k_r e^{γ_last−γ_r}.
        if (owns_row) {
            let e_last = dec[db + len - 1u];
            for (var i = 0u; i < dk; i++) {
                m[i] *= e_last;
            }
        }
        for (var r = 0u; r < len; r++) {
            workgroupBarrier();
            let f = dec[db + DELTA_CHUNK + r];
            for (var i = li; i < dk; i += DELTA_ROWS) {
                a_sh[i] = f * u[(tc + r) * P.conv_dim + k_off + i];
            }
            workgroupBarrier();
            if (owns_row) {
                let vn = x_mat[xb + r * xw + c];
                for (var i = 0u; i < dk; i++) {
                    m[i] += vn * a_sh[i];
                }
            }
        }
    }

    if (owns_row) {
        for (var i = 0u; i < dk; i++) {
            state[row + i] = m[i];
        }
    }
}
