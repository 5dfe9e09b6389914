// Causal GQA softmax attention of one query row over a range of cache rows, shared by
// attention.wgsl (whole range) and attention_split.wgsl (one piece of it, flash-decoding).
// The query and the caches are bindings 2-4, declared here; the kernel declares its parameters
// (binding 0), where the positions come from (binding 1: lib_att_pos.wgsl, or the rows of
// attention_rows_split.wgsl) and its output (binding 5). With an online softmax over tiles of ATT_WG keys:
//   1. invocation j scores key key0 + j: s_j = dot(q, k) * scale (q staged in workgroup memory);
//   2. a tree reduction finds the tile's max; the running max m moves to max(m, tile max) and
//      everything accumulated so far is rescaled by alpha = exp(m_old - m_new);
//   3. p_j = exp(s_j - m_new) goes to workgroup memory; every invocation adds the tile's p_j to
//      its running sum l and p_j * v_j to the output dims it owns (li + r * ATT_WG, r < 4: the
//      components of a vec4), so the V loads of one key row are coalesced across the workgroup.
// The exponent arguments are always <= 0, so nothing overflows.
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;

const NEG_BIG: f32 = -3.0e38; // "minus infinity" without relying on infinities in the shader

var<workgroup> q_sh: array<f32, ATT_MAX_D>;
var<workgroup> red: array<f32, ATT_WG>; // tile max reduction
var<workgroup> p_sh: array<f32, ATT_WG>; // the tile's softmax numerators

// Running max, running sum and unnormalised output (dims li + r * ATT_WG) of a key range.
struct Att {
    m: f32,
    l: f32,
    o: vec4<f32>,
}

// Keys k_begin..k_end of the cache rows (row stride kv_stride, this KV head at kv_off) against
// the query at q_off (d dims). k_begin, k_end are uniform across the workgroup.
fn attend(li: u32, q_off: u32, kv_off: u32, kv_stride: u32, d: u32, k_begin: u32, k_end: u32,
          scale: f32) -> Att {
    for (var i = li; i < d; i += ATT_WG) {
        q_sh[i] = q[q_off + i];
    }
    workgroupBarrier();
    var a = Att(NEG_BIG, 0.0, vec4<f32>(0.0));
    for (var key0 = k_begin; key0 < k_end; key0 += ATT_WG) {
        let n_tile = min(ATT_WG, k_end - key0);
        // 1. One score per invocation.
        var s = NEG_BIG;
        if (li < n_tile) {
            let k_off = (key0 + li) * kv_stride + kv_off;
            var dot = 0.0;
            for (var i = 0u; i < d; i++) {
                dot += q_sh[i] * k_cache[k_off + i];
            }
            s = dot * scale;
        }
        red[li] = s;
        workgroupBarrier();
        // 2. Tile max, new running max, rescale factor for the old sums.
        for (var stride = ATT_WG / 2u; stride > 0u; stride >>= 1u) {
            if (li < stride) {
                red[li] = max(red[li], red[li + stride]);
            }
            workgroupBarrier();
        }
        let m_new = max(a.m, red[0]);
        let alpha = exp(a.m - m_new); // 0 on the first tile (a.m - m_new ~ -3e38)
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
        a.l = a.l * alpha + tile_sum;
        for (var r = 0u; r < 4u; r++) {
            let dim = li + r * ATT_WG;
            if (dim < d) {
                var acc = 0.0;
                for (var j = 0u; j < n_tile; j++) {
                    acc += p_sh[j] * v_cache[(key0 + j) * kv_stride + kv_off + dim];
                }
                a.o[r] = a.o[r] * alpha + acc;
            }
        }
        a.m = m_new;
        // red and p_sh are rewritten by the next tile.
        workgroupBarrier();
    }
    return a;
}
