// Chunked gated delta rule, part 1 (spec/DELTANET.md B.1-B.2): everything that depends only on
// the chunk's own tokens, for one (chunk n, value head j) per workgroup of DELTA_WG = 4·DELTA_CHUNK
// invocations. Chunks are independent, so all run in parallel.
//
// Writes to global scratch (blk = j * nb + n), rows r < len (the chunk's true length) only:
//   dec[blk][0][r] = e^{γ_r}            dec[blk][1][r] = e^{γ_last − γ_r}
//   P[blk][r][s]   = (q_r·k_s) e^{γ_r − γ_s}       for s ≤ r (the upper part is not written:
//                                                  delta_rule_chunk_state reads only s ≤ r)
//   X[blk][r]      = [U_r | W_r], the solution of (I + A) X = [β v | β e^γ k] (forward substitution)
// with A[r][s] = β_r (k_r·k_s) e^{γ_r − γ_s} for s < r, which never leaves workgroup memory.
//
// Two phases:
// 1. A and P: the products K Kᵀ and Q Kᵀ of the chunk (64 × 64 × dk each), tiled: K and Q are
//    staged in workgroup memory a slice of DELTA_SLICE key elements at a time, and invocation
//    li = 4r + qd accumulates row r, columns 16qd .. 16qd + 15 of both in eight vec4 registers.
// 2. The solve: invocation li owns the columns li, li + DELTA_WG, ... of X and walks the rows (the
//    rows are sequential, the columns independent). A is read from workgroup memory (the same
//    element by every invocation at once: a broadcast); the column's earlier rows from X itself.
//
// Precision: γ is the cumulative sum of g inside the chunk. With |g| up to ~20 per token γ reaches
// −1000s, where an f32 ulp is ~1e-4, so a difference γ_r − γ_s of two rounded cumulative sums
// would carry ~1e-4 absolute error into every exponent (1e-4 relative error in each decay,
// even in factors close to 1). Instead every exponent is formed as a direct f32 sum of the g's it
// spans: γ_r − γ_s = Σ_{s<t≤r} g_t (accumulated while s walks down from r), γ_last − γ_r =
// Σ_{r<t<L} g_t, and γ_r = Σ_{t≤r} g_t. The rounding error of such a sum is a few ulp of the
// exponent itself, i.e. tiny whenever the factor e^{exponent} is not negligible. Only s ≤ r
// contributes (masked after exp, and the exponent there is ≤ 0 too: 0 where s ≥ r), so no exp of
// a positive number is ever evaluated and the decay is never factored.
//
// Back-edges per invocation (lavapipe ends a shader invocation's loops after 65535 in total):
// ~dk/DELTA_SLICE·(DELTA_SLICE + 2) + 3·DELTA_CHUNK for phase 1, ~DELTA_CHUNK²/2 per owned column
// in phase 2 (one column per invocation while dv + dk ≤ DELTA_WG), ~2.4K at dk = dv = 128.


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
@group(0) @binding(4) var<storage, read_write> p_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, DELTA_CHUNK]
@group(0) @binding(5) var<storage, read_write> x_mat: array<f32>;    // [Hv, nb, DELTA_CHUNK, dv + dk]
@group(0) @binding(6) var<storage, read_write> dec: array<f32>;      // [Hv, nb, 2, DELTA_CHUNK]

// Key elements per staged slice of K and Q.
const DELTA_SLICE: u32 = 8u;
// vec4s per token row of the transposed slices.
const CQ: u32 = DELTA_CHUNK / 4u;

// g and β of the chunk (0 past its end: padding tokens leave everything unchanged), e^{γ_r}.
var<workgroup> g_sh: array<f32, DELTA_CHUNK>;
var<workgroup> b_sh: array<f32, DELTA_CHUNK>;
var<workgroup> eg_sh: array<f32, DELTA_CHUNK>;
// One slice of K and Q, transposed and four tokens to a vector: kt[i·CQ + s/4][s%4] = k_s[i0 + i],
// so that the 16 columns s of an invocation are four vector loads.
var<workgroup> kt: array<vec4<f32>, DELTA_SLICE * CQ>;
var<workgroup> qt: array<vec4<f32>, DELTA_SLICE * CQ>;
// The strictly lower part of A, packed by rows: A[r][s] at r(r−1)/2 + s (8 KiB instead of 16).
var<workgroup> a_sh: array<f32, DELTA_CHUNK * (DELTA_CHUNK - 1u) / 2u>;

fn tri(r: u32) -> u32 {
    return select(0u, r * (r - 1u) / 2u, r > 0u);
}

// e^{γ_r − γ_s} for s = s0 + 3, s0 + 2, s0 + 1, s0 (in that order, returned as a vector over
// s0 .. s0 + 3), where *d holds γ_r − γ_{s0+3} (0 when s0 + 3 ≥ r) on entry and γ_r − γ_{s0−1} on
// exit: walking s down, γ_r − γ_{s−1} = (γ_r − γ_s) + g_s for s ≤ r (0 above). Literal components
// keep everything in registers.
fn decay4(d: ptr<function, f32>, r: u32, s0: u32) -> vec4<f32> {
    var e: vec4<f32>;
    e.w = exp(*d);
    *d += select(0.0, g_sh[s0 + 3u], s0 + 3u <= r);
    e.z = exp(*d);
    *d += select(0.0, g_sh[s0 + 2u], s0 + 2u <= r);
    e.y = exp(*d);
    *d += select(0.0, g_sh[s0 + 1u], s0 + 1u <= r);
    e.x = exp(*d);
    *d += select(0.0, g_sh[s0], s0 <= r);
    return e;
}

// Columns s0 .. s0 + 3 of row r of A (only s < r is stored) and of P (s ≤ r), with the decays e.
fn store4(mat: u32, r: u32, s0: u32, kk: vec4<f32>, qk: vec4<f32>, e: vec4<f32>) {
    let s = vec4<u32>(s0) + vec4<u32>(0u, 1u, 2u, 3u);
    let a = b_sh[r] * kk * e;
    let p = select(vec4<f32>(0.0), qk * e, s <= vec4<u32>(r));
    let ab = tri(r) + s0;
    if (s.x < r) { a_sh[ab] = a.x; }
    if (s.y < r) { a_sh[ab + 1u] = a.y; }
    if (s.z < r) { a_sh[ab + 2u] = a.z; }
    if (s.w < r) { a_sh[ab + 3u] = a.w; }
    let pb = mat + r * DELTA_CHUNK + s0;
    p_mat[pb] = p.x;
    p_mat[pb + 1u] = p.y;
    p_mat[pb + 2u] = p.z;
    p_mat[pb + 3u] = p.w;
}

@compute @workgroup_size(DELTA_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wg.x;
    let j = wg.y;
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

    if (li < DELTA_CHUNK) {
        let ok = li < len;
        g_sh[li] = select(0.0, g[(tc + li) * P.hv + j], ok);
        b_sh[li] = select(0.0, beta[(tc + li) * P.hv + j], ok);
    }
    workgroupBarrier();

    // The decays of row r = li (one invocation per token).
    if (li < len) {
        let r = li;
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
    }

    // Phase 1: row r, columns c0 .. c0 + 15 of K Kᵀ and Q Kᵀ.
    let r = li / 4u;
    let c0 = (li % 4u) * 16u;
    var kk0 = vec4<f32>(0.0);
    var kk1 = vec4<f32>(0.0);
    var kk2 = vec4<f32>(0.0);
    var kk3 = vec4<f32>(0.0);
    var qk0 = vec4<f32>(0.0);
    var qk1 = vec4<f32>(0.0);
    var qk2 = vec4<f32>(0.0);
    var qk3 = vec4<f32>(0.0);
    for (var i0 = 0u; i0 < dk; i0 += DELTA_SLICE) {
        // The previous slice is consumed (and, the first time, eg_sh is written).
        workgroupBarrier();
        // Key element fastest: each token's slice is one contiguous run of u.
        for (var e = li; e < DELTA_SLICE * DELTA_CHUNK; e += DELTA_WG) {
            let i = e % DELTA_SLICE;
            let s = e / DELTA_SLICE;
            let ok = s < len && i0 + i < dk;
            let row = (tc + s) * P.conv_dim + i0 + i;
            kt[i * CQ + s / 4u][s % 4u] = select(0.0, u[row + k_off], ok);
            qt[i * CQ + s / 4u][s % 4u] = select(0.0, u[row + q_off], ok);
        }
        workgroupBarrier();
        for (var i = 0u; i < DELTA_SLICE; i++) {
            let base = i * CQ;
            let kr = kt[base + r / 4u][r % 4u];
            let qr = qt[base + r / 4u][r % 4u];
            let cb = base + c0 / 4u;
            let k0 = kt[cb];
            let k1 = kt[cb + 1u];
            let k2 = kt[cb + 2u];
            let k3 = kt[cb + 3u];
            kk0 += kr * k0;
            kk1 += kr * k1;
            kk2 += kr * k2;
            kk3 += kr * k3;
            qk0 += qr * k0;
            qk1 += qr * k1;
            qk2 += qr * k2;
            qk3 += qr * k3;
        }
    }
    // Blocks entirely above the diagonal (c0 > r) hold nothing anyone reads.
    if (r < len && c0 <= r) {
        // γ_r − γ_{c0+15} = Σ_{c0+15<t≤r} g_t, summed from t = r down (0 when c0 + 15 ≥ r).
        var d = 0.0;
        for (var t = r; t > c0 + 15u; t--) {
            d += g_sh[t];
        }
        store4(mat, r, c0 + 12u, kk3, qk3, decay4(&d, r, c0 + 12u));
        store4(mat, r, c0 + 8u, kk2, qk2, decay4(&d, r, c0 + 8u));
        store4(mat, r, c0 + 4u, kk1, qk1, decay4(&d, r, c0 + 4u));
        store4(mat, r, c0, kk0, qk0, decay4(&d, r, c0));
    }
    workgroupBarrier();

    // Phase 2: (I + A) X = B by forward substitution, X_r = B_r − Σ_{s<r} A[r][s] X_s.
    for (var col = li; col < xw; col += DELTA_WG) {
        for (var r2 = 0u; r2 < len; r2++) {
            var x: f32;
            if (col < dv) {
                x = b_sh[r2] * u[(tc + r2) * P.conv_dim + v_off + col];
            } else {
                x = (b_sh[r2] * eg_sh[r2]) * u[(tc + r2) * P.conv_dim + k_off + (col - dv)];
            }
            let ab = tri(r2);
            for (var s = 0u; s < r2; s++) {
                x -= a_sh[ab + s] * x_mat[xb + s * xw + col];
            }
            x_mat[xb + r2 * xw + col] = x;
        }
    }
}
