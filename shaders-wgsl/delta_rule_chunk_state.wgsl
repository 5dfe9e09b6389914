// Chunked gated delta rule, part 2 (spec/DELTANET.md B.3 in the value-major layout M = Sᵀ):
// the sequential pass over the chunks of a batch, using the scratch of delta_rule_chunk_prep.
//
// Row c of B.3 only ever needs row c of the state M (with M_c the row at the chunk start):
//   vn[r][c] = U[r][c] − W_r · M_c                         (V_newᵀ = Uᵀ − M Wᵀ, row c)
//   O[r][c]  = e^{γ_r} (q_r · M_c) + Σ_{s≤r} P[r][s] vn[s][c]   ((Q⊙e^γ) Mᵀ + P V_new, column c)
//   M_c     ← e^{γ_last} M_c + Σ_r vn[r][c] · (k_r e^{γ_last−γ_r})
// so one workgroup owns a block of DELTA_ROWS state rows of one value head for the whole batch,
// with no communication between workgroups. Only the chunks are sequential: inside a chunk the
// three lines are products over all tokens at once, each output owned by one invocation:
// a. vn and q·M (64 tokens × DELTA_ROWS rows, reduction over dk): invocation li = r·RV + cq owns
//    token r and rows 4cq .. 4cq + 3 of the block, a vec4 each; the block of M is in workgroup
//    memory with the rows four to a vector, so each key element is one vector load.
// b. O (the same outputs, reduction over the tokens s ≤ r of vn, which is in workgroup memory).
// c. The state update (DELTA_ROWS rows × dk, reduction over the tokens): four key elements of one
//    row per invocation and pass.
// Two barriers per chunk: vn is complete before b and c read it; the update is complete before
// the next chunk's a reads the state.
//
// Back-edges per invocation (lavapipe ends a shader invocation's loops after 65535 in total):
// ~dk + DELTA_CHUNK + ⌈DELTA_ROWS·dk/4 / DELTA_WG⌉·(DELTA_CHUNK + 1) per chunk, ~320 at
// dk = 128, so a batch of up to 16 chunks is one dispatch.


struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    conv_dim: u32,
    t0: u32,
    n_tok: u32,
    nb: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;              // [T, conv_dim]
@group(0) @binding(2) var<storage, read_write> state: array<f32>;    // [Hv, dv, dk]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;      // [T, Hv*dv]
@group(0) @binding(4) var<storage, read> p_mat: array<f32>;          // [Hv, nb, DELTA_CHUNK, DELTA_CHUNK]
@group(0) @binding(5) var<storage, read> x_mat: array<f32>;          // [Hv, nb, DELTA_CHUNK, dv + dk]
@group(0) @binding(6) var<storage, read> dec: array<f32>;            // [Hv, nb, 2, DELTA_CHUNK]

// vec4s per row block (its state rows, four to a vector).
const RV: u32 = DELTA_ROWS / 4u;

// The block of the state, transposed: m_sh[i·RV + c/4][c%4] = M[c_first + c][i] (8 KiB).
var<workgroup> m_sh: array<vec4<f32>, DELTA_MAX_DK * RV>;
// The chunk's V_new for the block: vn_sh[r·RV + c/4][c%4] = vn[r][c_first + c] (4 KiB).
var<workgroup> vn_sh: array<vec4<f32>, DELTA_CHUNK * RV>;

@compute @workgroup_size(DELTA_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let j = wg.y;
    let c_first = wg.x * DELTA_ROWS; // first state row of the block
    let dk = P.dk;
    let dv = P.dv;
    let kh = j % P.hk;
    let key_dim = P.hk * dk;
    let q_off = kh * dk;
    let k_off = key_dim + kh * dk;
    let xw = dv + dk;
    let head = j * dv * dk;

    // Rows past dv (the last block of a dv that is not a multiple of DELTA_ROWS) are zero and
    // never stored; every row is independent of the others, so they cannot disturb the rest.
    for (var e = li; e < DELTA_ROWS * dk; e += DELTA_WG) {
        let c = e / dk;
        let i = e % dk;
        m_sh[i * RV + c / 4u][c % 4u] = select(0.0, state[head + (c_first + c) * dk + i], c_first + c < dv);
    }

    // Phases a and b: token r, rows c_first + 4cq .. + 3.
    let r = li / RV;
    let cq = li % RV;
    let c4 = c_first + 4u * cq;
    let c_ok = vec4<u32>(c4) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(dv);
    // Phase c: 4 key elements of one row per pass.
    let dk4 = (dk + 3u) / 4u;

    for (var n = 0u; n < P.nb; n++) {
        let tc = P.t0 + n * DELTA_CHUNK;
        let len = min(DELTA_CHUNK, P.n_tok - n * DELTA_CHUNK);
        let blk = j * P.nb + n;
        let mat = blk * DELTA_CHUNK * DELTA_CHUNK;
        let xb = blk * DELTA_CHUNK * xw;
        let db = blk * 2u * DELTA_CHUNK;
        // The state block is loaded (first chunk) or updated (phase c of the previous one).
        workgroupBarrier();

        // a. vn = U − W Mᵀ and Q Mᵀ for token r, from the state at the chunk start. Tokens past
        // the chunk's end are padding: vn = 0 (β = 0), no output.
        var wm = vec4<f32>(0.0);
        var qm = vec4<f32>(0.0);
        let live = r < len;
        if (live) {
            let w_row = xb + r * xw + dv;
            let q_row = (tc + r) * P.conv_dim + q_off;
            for (var i = 0u; i < dk; i++) {
                let m = m_sh[i * RV + cq];
                wm += x_mat[w_row + i] * m;
                qm += u[q_row + i] * m;
            }
        }
        let ub = xb + r * xw + c4;
        let uu = vec4<f32>(x_mat[ub], x_mat[ub + 1u], x_mat[ub + 2u], x_mat[ub + 3u]);
        vn_sh[r * RV + cq] = select(vec4<f32>(0.0), uu - wm, c_ok & vec4<bool>(live));
        workgroupBarrier();

        // b. O[r] = e^{γ_r} q_r·M + Σ_{s≤r} P[r][s] vn[s].
        if (live) {
            var intra = vec4<f32>(0.0);
            let p_row = mat + r * DELTA_CHUNK;
            for (var s = 0u; s <= r; s++) {
                intra += p_mat[p_row + s] * vn_sh[s * RV + cq];
            }
            let o = dec[db + r] * qm + intra;
            let ob = ((tc + r) * P.hv + j) * dv + c4;
            if (c_ok.x) { out[ob] = o.x; }
            if (c_ok.y) { out[ob + 1u] = o.y; }
            if (c_ok.z) { out[ob + 2u] = o.z; }
            if (c_ok.w) { out[ob + 3u] = o.w; }
        }

        // c. M_c ← e^{γ_last} M_c + Σ_s vn[s][c] · k_s e^{γ_last−γ_s}, elements i .. i + 3 of row c.
        // Only this invocation touches them in this phase (phase a is behind the barrier).
        let e_last = dec[db + len - 1u];
        for (var e = li; e < DELTA_ROWS * dk4; e += DELTA_WG) {
            let c = e / dk4;
            let i = (e % dk4) * 4u;
            let mi = i * RV + c / 4u;
            let cc = c % 4u;
            // Past dk (a dk that is not a multiple of 4) the lanes work on slots of m_sh that
            // phase a never reads (dk4·4 ≤ DELTA_MAX_DK keeps them inside the array).
            var acc = e_last * vec4<f32>(
                m_sh[mi][cc],
                m_sh[mi + RV][cc],
                m_sh[mi + 2u * RV][cc],
                m_sh[mi + 3u * RV][cc],
            );
            for (var s = 0u; s < len; s++) {
                let vn = vn_sh[s * RV + c / 4u][cc];
                let f = dec[db + DELTA_CHUNK + s];
                let kb = (tc + s) * P.conv_dim + k_off + i;
                acc += vn * (f * vec4<f32>(u[kb], u[kb + 1u], u[kb + 2u], u[kb + 3u]));
            }
            m_sh[mi][cc] = acc.x;
            m_sh[mi + RV][cc] = acc.y;
            m_sh[mi + 2u * RV][cc] = acc.z;
            m_sh[mi + 3u * RV][cc] = acc.w;
        }
    }
    workgroupBarrier();

    for (var e = li; e < DELTA_ROWS * dk; e += DELTA_WG) {
        let c = e / dk;
        let i = e % dk;
        if (c_first + c < dv) {
            state[head + (c_first + c) * dk + i] = m_sh[i * RV + c / 4u][c % 4u];
        }
    }
}
