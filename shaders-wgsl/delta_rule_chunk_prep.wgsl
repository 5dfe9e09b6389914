// Chunked gated delta rule, part 1 (spec/DELTANET.md B.1-B.2): everything that depends only on
// the chunk's own tokens, for one (chunk n, value head j) per workgroup, DELTA_CHUNK = 64 invocations
// (invocation r = token r of the chunk). Chunks are independent, so all run in parallel.
//
// Writes to global scratch (blk = j * nb + n):
//   dec[blk][0][r] = e^{γ_r}            dec[blk][1][r] = e^{γ_last − γ_r}
//   A[blk][r][s]   = β_r (k_r·k_s) e^{γ_r − γ_s}   for s < r, else 0
//   P[blk][r][s]   = (q_r·k_s) e^{γ_r − γ_s}       for s ≤ r, else 0
//   X[blk][r]      = [U_r | W_r], the solution of (I + A) X = [β v | β e^γ k] (forward substitution)
// A and P live in global memory: one 64×64 f32 matrix is already the whole 16 KiB of workgroup
// memory WebGPU guarantees.
//
// Precision: γ is the cumulative sum of g inside the chunk. With |g| up to ~20 per token γ reaches
// −1000s, where an f32 ulp is ~1e-4, so a difference γ_r − γ_s of two rounded cumulative sums
// would carry ~1e-4 absolute error into every exponent (1e-4 relative error in each decay,
// even in factors close to 1). Instead every exponent is formed as a direct f32 sum of the g's it
// spans: γ_r − γ_s = Σ_{s<t≤r} g_t (accumulated while s walks down from r), γ_last − γ_r =
// Σ_{r<t<L} g_t, and γ_r = Σ_{t≤r} g_t. The rounding error of such a sum is a few ulp of the
// exponent itself, i.e. tiny whenever the factor e^{exponent} is not negligible. Only s ≤ r
// is ever evaluated, so every exponent is ≤ 0 (mask before exp; the decay is never factored).


struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    conv_dim: u32,
    t0: u32,    // first token of this batch of chunks (row of u, g, beta)
    n_tok: u32, // tokens in this batch; the last chunk may be shorter than DELTA_CHUNK
    nb: u32,    // chunks in this batch
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;              // [T, conv_dim] = [q | k | v]
@group(0) @binding(2) var<storage, read> g: array<f32>;              // [T, Hv]
@group(0) @binding(3) var<storage, read> beta: array<f32>;           // [T, Hv]
@group(0) @binding(4) var<storage, read_write> a_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, DELTA_CHUNK]
@group(0) @binding(5) var<storage, read_write> p_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, DELTA_CHUNK]
@group(0) @binding(6) var<storage, read_write> x_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, dv + dk]
@group(0) @binding(7) var<storage, read_write> dec: array<f32>;      // [Hv, nb, 2, DELTA_CHUNK]

var<workgroup> g_sh: array<f32, DELTA_CHUNK>;
var<workgroup> b_sh: array<f32, DELTA_CHUNK>;
var<workgroup> eg_sh: array<f32, DELTA_CHUNK>; // e^{γ_r}

@compute @workgroup_size(DELTA_CHUNK)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wg.x;
    let j = wg.y;
    let r = li;
    let tc = P.t0 + n * DELTA_CHUNK;               // first token of the chunk
    let len = min(DELTA_CHUNK, P.n_tok - n * DELTA_CHUNK);   // true length: the last chunk is not padded
    let dk = P.dk;
    let dv = P.dv;
    let kh = j % P.hk;
    let key_dim = P.hk * dk;
    let q_off = kh * dk;
    let k_off = key_dim + kh * dk;
    let v_off = 2u * key_dim + j * dv;
    let blk = j * P.nb + n;
    let mat = blk * DELTA_CHUNK * DELTA_CHUNK;
    let xw = dv + dk;
    let xb = blk * DELTA_CHUNK * xw;
    let db = blk * 2u * DELTA_CHUNK;

    if (r < len) {
        g_sh[r] = g[(tc + r) * P.hv + j];
        b_sh[r] = beta[(tc + r) * P.hv + j];
    }
    workgroupBarrier();

    if (r < len) {
        var gam = 0.0; // γ_r
        for (var t = 0u; t <= r; t++) {
            gam += g_sh[t];
        }
        var tail = 0.0; // γ_last − γ_r
        for (var t = r + 1u; t < len; t++) {
            tail += g_sh[t];
        }
        let eg = exp(gam);
        eg_sh[r] = eg;
        dec[db + r] = eg;
        dec[db + DELTA_CHUNK + r] = exp(tail);

        // Row r of A and P. s walks down from r so that d = γ_r − γ_s is a direct sum.
        let qr = (tc + r) * P.conv_dim + q_off;
        let kr = (tc + r) * P.conv_dim + k_off;
        var d = 0.0;
        var s = r;
        loop {
            let ks = (tc + s) * P.conv_dim + k_off;
            var kk = 0.0;
            var qk = 0.0;
            for (var i = 0u; i < dk; i++) {
                let x = u[ks + i];
                kk += u[kr + i] * x;
                qk += u[qr + i] * x;
            }
            let e = exp(d);
            a_mat[mat + r * DELTA_CHUNK + s] = select(0.0, b_sh[r] * kk * e, s < r);
            p_mat[mat + r * DELTA_CHUNK + s] = qk * e;
            if (s == 0u) {
                break;
            }
            d += g_sh[s];
            s -= 1u;
        }
        // Keep the scratch a clean triangular matrix (nothing reads the upper part).
        for (var s2 = r + 1u; s2 < DELTA_CHUNK; s2++) {
            a_mat[mat + r * DELTA_CHUNK + s2] = 0.0;
            p_mat[mat + r * DELTA_CHUNK + s2] = 0.0;
        }
    }
    // A rows were written by other invocations; the solve below reads all of them.
    storageBarrier();
    workgroupBarrier();

    // (I + A) X = B by forward substitution, X_r = B_r − Σ_{s<r} A[r][s] X_s. Columns of X are
    // independent, so each invocation owns columns col = li, li + DELTA_CHUNK, ... of [U | W] and walks r.
    for (var col = li; col < xw; col += DELTA_CHUNK) {
        for (var r2 = 0u; r2 < len; r2++) {
            var x: f32;
            if (col < dv) {
                x = b_sh[r2] * u[(tc + r2) * P.conv_dim + v_off + col];
            } else {
                x = (b_sh[r2] * eg_sh[r2]) * u[(tc + r2) * P.conv_dim + k_off + (col - dv)];
            }
            for (var s = 0u; s < r2; s++) {
                x -= a_mat[mat + r2 * DELTA_CHUNK + s] * x_mat[xb + s * xw + col];
            }
            x_mat[xb + r2 * xw + col] = x;
        }
    }
}
