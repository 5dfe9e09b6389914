// KV head `row` (= t * nkv + h) of the attention preparation (lib_attn_prep.wgsl): k normalised
// (k_norm) and rotated into k_normed, and with v stored at cache row pos + t.
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> k_norm: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_normed: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;

fn prep_kv(row: u32, li: u32, lanes: Lanes) {
    let t = row / P.nkv;
    let own = li < P.d;
    let j = min(li, P.d - 1u);
    let i = row * P.d + j;
    let p = pos[0] + t;
    let y = prep_head(select(0.0, k[i], own), k_norm[j], li, lanes, p);
    if (own) {
        k_normed[i] = y;
        if (p < P.ctx) {
            // Row p of the caches [ctx, nkv * d], head h = row - t * nkv.
            let o = p * (P.nkv * P.d) + (row - t * P.nkv) * P.d + j;
            k_cache[o] = y;
            v_cache[o] = v[i];
        }
    }
}
