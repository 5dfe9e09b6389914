// Causal GQA softmax attention of many query rows (prefill), flash-attention style, in f32: the
// math of attention.wgsl (q [T, H*D]; k_cache, v_cache [ctx, Hkv*D]; out [T, H*D]; query row t
// at absolute position pos + t attends to cache rows 0..=pos+t; head h reads KV head h / group),
// but a workgroup owns ATT_T_BQ query rows of one KV head, the rows i = t * group + g of that head
// (the group's query heads of consecutive tokens), and stages each tile of ATT_T_BK K rows and V
// rows in workgroup memory once for all of them: attention.wgsl reads every K and V row once per
// query row, straight from the cache.
//
// The workgroup is 8 x 16 invocations (ty = li / 16, tx = li % 16). Per key tile:
//   1. scores: invocation (ty, tx) owns rows ty + 8r and keys tx + 16j (r, j < 4), 16 scores
//      in four vec4 registers, summed over the head dims in chunks of ATT_T_DC staged for the
//      block's queries and the tile's keys (a chunk's vec4s padded by one, so the 16 keys an
//      invocation group reads at once fall in different banks). Keys past a row's causal end
//      score NEG_BIG.
//   2. online softmax: four invocations per row take a quarter of the tile's keys each; the
//      tile max moves the row's running max m to m_new, the old sums are rescaled by
//      alpha = exp(m_old - m_new) and p = exp(s - m_new) replaces the score in p_sh. Every
//      exponent argument is <= 0, so nothing overflows; a row's running sum l stays in
//      four partial sums (one per quarter), added up at the end.
//   3. output: invocation (ty, tx) owns rows ty + 8r and the vec4s of dims tx + 16c (c < 4,
//      ATT_MAX_D = 256 dims), 16 vec4s as one mat4x4 per row (columns indexed by constants only,
//      so they stay in registers); they are rescaled by alpha, then V rows are staged as many at
//      a time as the staging buffer holds, and o += p * v.
// At the end out = o / l. The staging buffer holds the q and k chunks of step 1 or the V rows
// of step 3 (ATT_T_SH vec4s: kernels.rs sizes it from the caps' geometry).

struct Params {
    n_head: u32,
    group: u32, // query heads per KV head
    d: u32,     // head_dim
    scale: f32,
    t_len: u32, // query tokens
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>; // read on the device: replayed steps see the current position
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const NEG_BIG: f32 = -3.0e38; // "minus infinity" without relying on infinities in the shader
const NO_ROW: u32 = 0xffffffffu; // q_row of a block row past the last query row
const QS: u32 = ATT_T_DC / 4u + 1u; // row stride (vec4s) of the staged q and k chunks
const KB: u32 = ATT_T_BQ * QS; // where the staged k chunk starts
const PS: u32 = ATT_T_BK + 1u; // row stride of p_sh: a row pass's 32 rows in different banks

var<workgroup> stage: array<vec4<f32>, ATT_T_SH>;
var<workgroup> p_sh: array<f32, ATT_T_BQ * PS>; // the tile's scores, then its numerators
var<workgroup> red: array<f32, ATT_T_WG>; // partial row maxima; at the end partial row sums
var<workgroup> alpha_sh: array<f32, ATT_T_BQ>; // each row's rescale factor of the tile
var<workgroup> q_row: array<u32, ATT_T_BQ>; // offset of each row's query (and output) in q

// One query row's scores against four keys (a vec4 of dims of each).
fn dots(x: vec4<f32>, k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>, k3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(x, k0), dot(x, k1), dot(x, k2), dot(x, k3));
}

// Scaled scores of block row `row` against the tile's keys tx + 16j into p_sh; keys at or past
// the row's causal end `end` score NEG_BIG.
fn put_scores(row: u32, s: vec4<f32>, end: u32, key0: u32, tx: u32) {
    for (var j = 0u; j < 4u; j++) {
        let kk = tx + 16u * j;
        var v = NEG_BIG;
        if (key0 + kk < end) {
            v = s[j] * P.scale;
        }
        p_sh[row * PS + kk] = v;
    }
}

// The causal end (exclusive) of block row `i` of the KV head's rows; rows past the last one
// take the block's end (they are computed on zero queries and not written).
fn row_end(i: u32, rows: u32, p0: u32, k_end: u32) -> u32 {
    if (i < rows) {
        return p0 + i / P.group + 1u;
    }
    return k_end;
}

// Dims 4 * c4 .. 4 * c4 + 3 (those below d) of a normalised output row.
fn store4(off: u32, c4: u32, v: vec4<f32>) {
    for (var e = 0u; e < 4u; e++) {
        let dim = 4u * c4 + e;
        if (dim < P.d) {
            out[off + dim] = v[e];
        }
    }
}

// Block row `r`'s output dims (tx + 16c vec4s) over its sum l (four partial sums in red).
fn store_row(r: u32, o: mat4x4<f32>, tx: u32) {
    let off = q_row[r];
    if (off == NO_ROW) {
        return;
    }
    let l = (red[r] + red[r + ATT_T_BQ]) + (red[r + 2u * ATT_T_BQ] + red[r + 3u * ATT_T_BQ]);
    let inv = 1.0 / l;
    // Constant column indices (a run-time one would copy the matrix to memory to index it).
    let d4n = (P.d + 3u) / 4u;
    if (tx < d4n) {
        store4(off, tx, o[0] * inv);
    }
    if (tx + 16u < d4n) {
        store4(off, tx + 16u, o[1] * inv);
    }
    if (tx + 32u < d4n) {
        store4(off, tx + 32u, o[2] * inv);
    }
    if (tx + 48u < d4n) {
        store4(off, tx + 48u, o[3] * inv);
    }
}

@compute @workgroup_size(ATT_T_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = P.group;
    let d = P.d;
    let n_kv = P.n_head / g;
    let kv_stride = n_kv * d;
    let rows = P.t_len * g; // query rows of one KV head
    let n_blk = (rows + ATT_T_BQ - 1u) / ATT_T_BQ;
    let w = linear_wg(wg, nwg);
    if (w >= n_kv * n_blk) {
        return; // the 2-D grid's rounding
    }
    let kvh = w % n_kv;
    let kv_off = kvh * d;
    // The latest tokens' blocks, the longest key ranges, first: the short ones fill in after.
    let i0 = (n_blk - 1u - w / n_kv) * ATT_T_BQ;
    let p0 = pos[0];
    let k_end = p0 + (min(i0 + ATT_T_BQ, rows) - 1u) / g + 1u; // the block's last causal end
    if (li < ATT_T_BQ) {
        let i = i0 + li;
        var off = NO_ROW;
        if (i < rows) {
            off = ((i / g) * P.n_head + kvh * g + i % g) * d;
        }
        q_row[li] = off;
    }
    let tx = li % 16u;
    let ty = li / 16u;
    let end0 = row_end(i0 + ty, rows, p0, k_end);
    let end1 = row_end(i0 + ty + 8u, rows, p0, k_end);
    let end2 = row_end(i0 + ty + 16u, rows, p0, k_end);
    let end3 = row_end(i0 + ty + 24u, rows, p0, k_end);
    // The row pass's row and quarter of the keys; its running max and partial sum.
    let pr = li % ATT_T_BQ;
    let pq = li / ATT_T_BQ;
    var m_run = NEG_BIG;
    var l_run = 0.0;
    // The output rows' accumulators, and the staged V columns they read (clamped into the row:
    // a column past the head's dims reads a real one, never stored).
    var o0 = mat4x4<f32>();
    var o1 = mat4x4<f32>();
    var o2 = mat4x4<f32>();
    var o3 = mat4x4<f32>();
    let d4n = (d + 3u) / 4u;
    let c0 = min(tx, d4n - 1u);
    let c1 = min(tx + 16u, d4n - 1u);
    let c2 = min(tx + 32u, d4n - 1u);
    let c3 = min(tx + 48u, d4n - 1u);
    let v_keys = min(ATT_T_BK, ATT_T_SH / d4n); // V rows per staging
    // This invocation's first vec4 of a V staging (row vj0, column vc0 of d4n) and the step of
    // ATT_T_WG vec4s in rows and columns: the divisions by d4n, hoisted out of the loops.
    let vj0 = li / d4n;
    let vc0 = li % d4n;
    let step_j = ATT_T_WG / d4n;
    let step_c = ATT_T_WG % d4n;
    workgroupBarrier(); // q_row

    for (var key0 = 0u; key0 < k_end; key0 += ATT_T_BK) {
        let n = min(ATT_T_BK, k_end - key0);
        // 1. Scores, in chunks of ATT_T_DC dims (zeros past d and past the block's keys).
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        var s2 = vec4<f32>(0.0);
        var s3 = vec4<f32>(0.0);
        for (var dc0 = 0u; dc0 < d; dc0 += ATT_T_DC) {
            for (var f = li; f < (ATT_T_BQ + ATT_T_BK) * ATT_T_DC; f += ATT_T_WG) {
                let r = f / ATT_T_DC;
                let dd = f % ATT_T_DC;
                let dim = dc0 + dd;
                var x = 0.0;
                if (r < ATT_T_BQ) {
                    let off = q_row[r];
                    if (off != NO_ROW && dim < d) {
                        x = q[off + dim];
                    }
                } else {
                    let key = key0 + r - ATT_T_BQ;
                    if (key < k_end && dim < d) {
                        x = k_cache[key * kv_stride + kv_off + dim];
                    }
                }
                stage[r * QS + dd / 4u][dd % 4u] = x;
            }
            workgroupBarrier();
            for (var d4 = 0u; d4 < ATT_T_DC / 4u; d4++) {
                let k0 = stage[KB + tx * QS + d4];
                let k1 = stage[KB + (tx + 16u) * QS + d4];
                let k2 = stage[KB + (tx + 32u) * QS + d4];
                let k3 = stage[KB + (tx + 48u) * QS + d4];
                s0 += dots(stage[ty * QS + d4], k0, k1, k2, k3);
                s1 += dots(stage[(ty + 8u) * QS + d4], k0, k1, k2, k3);
                s2 += dots(stage[(ty + 16u) * QS + d4], k0, k1, k2, k3);
                s3 += dots(stage[(ty + 24u) * QS + d4], k0, k1, k2, k3);
            }
            workgroupBarrier(); // the chunk is read before the next one (or V) is staged
        }
        put_scores(ty, s0, end0, key0, tx);
        put_scores(ty + 8u, s1, end1, key0, tx);
        put_scores(ty + 16u, s2, end2, key0, tx);
        put_scores(ty + 24u, s3, end3, key0, tx);
        workgroupBarrier();

        // 2. Online softmax: the tile max of row pr from its four quarters.
        let q0 = pr * PS + pq * (ATT_T_BK / 4u);
        var mx = NEG_BIG;
        for (var k = 0u; k < ATT_T_BK / 4u; k++) {
            mx = max(mx, p_sh[q0 + k]);
        }
        red[li] = mx;
        workgroupBarrier();
        let tile_max = max(max(red[pr], red[pr + ATT_T_BQ]), max(red[pr + 2u * ATT_T_BQ], red[pr + 3u * ATT_T_BQ]));
        let m_new = max(m_run, tile_max);
        let alpha = exp(m_run - m_new); // 0 on the first tile (m_run - m_new ~ -3e38)
        var sum = 0.0;
        for (var k = 0u; k < ATT_T_BK / 4u; k++) {
            let p = exp(p_sh[q0 + k] - m_new); // masked keys: exp(~-3e38) = 0 exactly
            p_sh[q0 + k] = p;
            sum += p;
        }
        l_run = l_run * alpha + sum;
        m_run = m_new;
        if (pq == 0u) {
            alpha_sh[pr] = alpha;
        }
        workgroupBarrier();

        // 3. o = o * alpha + p v, over the tile's n keys, v_keys V rows staged at a time.
        o0 = o0 * alpha_sh[ty];
        o1 = o1 * alpha_sh[ty + 8u];
        o2 = o2 * alpha_sh[ty + 16u];
        o3 = o3 * alpha_sh[ty + 24u];
        for (var kc0 = 0u; kc0 < n; kc0 += v_keys) {
            let nv = min(v_keys, n - kc0);
            var vj = vj0;
            var vc = vc0;
            while (vj < nv) {
                let at = (key0 + kc0 + vj) * kv_stride + kv_off + 4u * vc;
                let left = d - 4u * vc; // the head's dims from this vec4 on (at least 1)
                var v = vec4<f32>(v_cache[at], 0.0, 0.0, 0.0);
                if (left > 1u) {
                    v.y = v_cache[at + 1u];
                }
                if (left > 2u) {
                    v.z = v_cache[at + 2u];
                }
                if (left > 3u) {
                    v.w = v_cache[at + 3u];
                }
                stage[vj * d4n + vc] = v;
                vc += step_c;
                vj += step_j;
                if (vc >= d4n) {
                    vc -= d4n;
                    vj += 1u;
                }
            }
            workgroupBarrier();
            for (var j = 0u; j < nv; j++) {
                let vb = j * d4n;
                let vm = mat4x4<f32>(stage[vb + c0], stage[vb + c1], stage[vb + c2], stage[vb + c3]);
                let kk = kc0 + j;
                o0 += vm * p_sh[ty * PS + kk];
                o1 += vm * p_sh[(ty + 8u) * PS + kk];
                o2 += vm * p_sh[(ty + 16u) * PS + kk];
                o3 += vm * p_sh[(ty + 24u) * PS + kk];
            }
            workgroupBarrier(); // the rows are read before the next staging (or tile) overwrites them
        }
    }

    // out = o / l, l the sum of the row's four partial sums.
    red[li] = l_run;
    workgroupBarrier();
    store_row(ty, o0, tx);
    store_row(ty + 8u, o1, tx);
    store_row(ty + 16u, o2, tx);
    store_row(ty + 24u, o3, tx);
}
