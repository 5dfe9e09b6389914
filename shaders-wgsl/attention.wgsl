// Causal GQA softmax attention. q [T, H*D]; k_cache, v_cache [ctx, Hkv*D]; out [T, H*D].
// Query row t sits at absolute position pos0 + t and attends to cache rows 0..=pos0+t; query
// head h reads KV head h / (H / Hkv).
//
// One workgroup per (token, query head), with an online softmax over tiles of TILE keys, so any
// context length runs in a fixed 1.5 KiB of workgroup memory:
//   1. invocation j scores key key0 + j: s_j = dot(q, k) * scale (q is staged in workgroup memory);
//   2. a tree reduction finds the tile's max; the running max m moves to max(m, tile max) and
//      everything accumulated so far is rescaled by alpha = exp(m_old - m_new);
//   3. p_j = exp(s_j - m_new) goes to workgroup memory; every invocation adds the tile's p_j to
//      its running sum l and p_j * v_j to the output dims it owns (d = li, li + WG, ...), so the
//      V loads of one key row are coalesced across the workgroup.
// At the end out = o / l. The exponent arguments are always <= 0, so nothing overflows.
const WG: u32 = 64u;
const TILE: u32 = 64u; // = WG: one key per invocation in the scoring step
const MAX_D: u32 = 256u; // head_dim bound; checked on the host
const DPT: u32 = 4u; // output dims per invocation = MAX_D / WG
const NEG_BIG: f32 = -3.0e38; // "minus infinity" without relying on infinities in the shader

struct Params {
    n_head: u32,
    group: u32, // query heads per KV head
    d: u32,     // head_dim
    pos0: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> q_sh: array<f32, MAX_D>;
var<workgroup> red: array<f32, TILE>; // tile max reduction
var<workgroup> p_sh: array<f32, TILE>; // the tile's softmax numerators

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg); // = t * n_head + h
    let t = row / P.n_head;
    let h = row % P.n_head;
    let d = P.d;
    let kv_stride = (P.n_head / P.group) * d; // row length of the caches
    let kv_off = (h / P.group) * d; // this KV head's offset within a cache row
    let n_keys = P.pos0 + t + 1u; // causal: rows 0..=pos0+t

    let q_off = row * d; // q and out rows are [T][H][D]
    for (var i = li; i < d; i += WG) {
        q_sh[i] = q[q_off + i];
    }
    workgroupBarrier();

    var m = NEG_BIG; // running max of the scores seen so far
    var l = 0.0; // running sum of exp(score - m)
    var o: array<f32, DPT>; // running sum of exp(score - m) * v for dims li + r*WG
    for (var r = 0u; r < DPT; r++) {
        o[r] = 0.0;
    }

    for (var key0 = 0u; key0 < n_keys; key0 += TILE) {
        let n_tile = min(TILE, n_keys - key0);
        // 1. One score per invocation.
        var s = NEG_BIG;
        if (li < n_tile) {
            let k_off = (key0 + li) * kv_stride + kv_off;
            var dot = 0.0;
            for (var i = 0u; i < d; i++) {
                dot += q_sh[i] * k_cache[k_off + i];
            }
            s = dot * P.scale;
        }
        red[li] = s;
        workgroupBarrier();
        // 2. Tile max (tree reduction), new running max, rescale factor for the old sums.
        for (var stride = TILE / 2u; stride > 0u; stride >>= 1u) {
            if (li < stride) {
                red[li] = max(red[li], red[li + stride]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        let alpha = exp(m - m_new); // 0 on the first tile (m - m_new ~ -3e38)
        // 3. Numerators of this tile; masked-off slots contribute exactly 0.
        var p = 0.0;
        if (li < n_tile) {
            p = exp(s - m_new);
        }
        p_sh[li] = p;
        workgroupBarrier();
        var tile_sum = 0.0;
        for (var j = 0u; j < n_tile; j++) {
            tile_sum += p_sh[j];
        }
        l = l * alpha + tile_sum;
        for (var r = 0u; r < DPT; r++) {
            let dim = li + r * WG;
            if (dim < d) {
                var acc = 0.0;
                for (var j = 0u; j < n_tile; j++) {
                    acc += p_sh[j] * v_cache[(key0 + j) * kv_stride + kv_off + dim];
                }
                o[r] = o[r] * alpha + acc;
            }
        }
        m = m_new;
        // red and p_sh are rewritten by the next tile.
        workgroupBarrier();
    }

    let inv = 1.0 / l;
    for (var r = 0u; r < DPT; r++) {
        let dim = li + r * WG;
        if (dim < d) {
            out[q_off + dim] = o[r] * inv;
        }
    }
}
